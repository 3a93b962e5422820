"""The YAML config: validated once, messages that name the field, the value and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.config import ConfigError, ModelConfig, import_object, load_config

MODEL = {
    "name": "square", "transformer": "deployments.models:Square",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "fp32", "shape": [-1]}],
}


def bad(match: str, **model) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config({"models": [{**MODEL, **model}]})


def test_the_demo_config_loads(tmp_path):
    from cluster.config import DEMO_CONFIG

    cfg = load_config(DEMO_CONFIG)
    assert {m.name for m in cfg.models} >= {"square", "mlp"}
    assert cfg.model("square").outputs[0].datatype == "FP32"  # normalised to upper case


def test_messages_name_the_field_the_value_and_the_fix():
    bad(r"models\.0\.batching\.max_batch_size=0: must be greater than or equal to 1",
        batching={"max_batch_size": 0})
    bad(r"min_replicas=3 exceeds max_replicas=2: lower min_replicas or raise max_replicas",
        replicas={"min_replicas": 3, "max_replicas": 2})
    bad(r"shape=\[3\] must start with -1, the batch dimension",
        inputs=[{"name": "x", "datatype": "FP32", "shape": [3]}])
    bad(r"datatype='FP33' is not one of", inputs=[{"name": "x", "datatype": "FP33",
                                                   "shape": [-1]}])
    bad(r"transformer='Square' must look like 'package.module:ClassName'", transformer="Square")
    bad(r"name='a b' must be letters", name="a b")
    bad(r"preferred_batch_sizes \[64\] exceed max_batch_size=8",
        batching={"max_batch_size": 8, "preferred_batch_sizes": [64]})


@pytest.mark.parametrize("where, field", [
    ({"replicas": {"num_cpus": float("inf")}}, r"replicas\.num_cpus=inf"),
    ({"replicas": {"num_gpus": float("inf")}}, r"replicas\.num_gpus=inf"),
    ({"replicas": {"scale_down_idle_s": float("inf")}}, r"replicas\.scale_down_idle_s=inf"),
    ({"batching": {"max_queue_delay_s": float("inf")}}, r"batching\.max_queue_delay_s=inf"),
    ({"batching": {"max_queue_delay_s": float("nan")}}, r"batching\.max_queue_delay_s=nan"),
    ({"batching": {"kind": "sequence", "max_sequence_idle_s": float("inf")}},
     r"batching\.max_sequence_idle_s=inf"),
])
def test_a_setting_that_is_not_a_finite_number_is_refused(where, field):
    """inf or nan would reach Ray (num_cpus=inf), never send a batch that is not full
    (an endless delay) or never end a sequence: none means anything a user can want that
    the settings' own None or a large number does not say."""
    bad(rf"models\.0\.{field}: must be a finite number", **where)
    with pytest.raises(ConfigError, match=r"ingress\.num_cpus=inf: must be a finite number"):
        load_config({"models": [MODEL], "ingress": {"num_cpus": float("inf")}})


def test_a_ragged_inputs_pad_value_may_be_any_float():
    """A tensor's pad value is data, not a setting: -inf (a mask's usual pad) is kept."""
    ragged = {"name": "x", "datatype": "FP32", "shape": [-1, -1],
              "ragged": {"pad_value": float("-inf")}}
    config = load_config({"models": [{**MODEL, "inputs": [ragged]}]})
    assert config.models[0].inputs[0].ragged.pad_value == float("-inf")


def test_duplicate_model_names_and_unknown_keys_are_refused():
    with pytest.raises(ConfigError, match=r"model names \['square'\] appear more than once"):
        load_config({"models": [MODEL, MODEL]})
    with pytest.raises(ConfigError, match="max_batch_sise"):
        load_config({"models": [{**MODEL, "batching": {"max_batch_sise": 4}}]})


def test_files_missing_or_not_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(broken)
    binary = tmp_path / "binary.yaml"  # a UnicodeDecodeError's traceback once
    binary.write_bytes(b"app_name: x\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid start byte at byte 12\)"):
        load_config(binary)
    with pytest.raises(ConfigError, match="cannot be read: Is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match=r"/dev/zero is more than 16 MiB: a config is a YAML "
                                          r"file of a few kilobytes"):
        load_config("/dev/zero")  # read up to a bound, not whole


def test_a_file_of_aliases_of_aliases_or_endless_nesting_is_refused_before_it_is_walked(tmp_path):
    """A few hundred bytes of YAML aliases expand to billions of values (validating and
    rendering it took all memory); nesting past the parser's depth was a RecursionError's
    traceback. Each is a ConfigError naming the file; a config sharing a block by an alias,
    as YAML users do, still loads."""
    levels = ['x0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("app_name: x\nmodels:\n  - name: square\n    transformer: "
                    "deployments.models:Square\n    init_kwargs:\n"
                    + "".join(f"      {line}\n" for line in levels))
    with pytest.raises(ConfigError, match=r"bomb\.yaml holds 1,234,567,9\d\d values once its "
                                          r"YAML aliases \(\*name\) are expanded, more than a "
                                          r"config can \(1,000,000\)"):
        load_config(bomb)
    deep = tmp_path / "deep.yaml"
    deep.write_text("app_name: x\nmodels: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml nests lists or mappings deeper than the "
                                          r"YAML parser can follow"):
        load_config(deep)
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "app_name: x\nmodels:\n"
        "  - {name: a, transformer: 'deployments.models:Square', batching: &fast "
        "{max_batch_size: 8}, inputs: &in [{name: INPUT0, datatype: FP32, shape: [-1]}], "
        "outputs: &out [{name: OUTPUT0, datatype: FP32, shape: [-1]}]}\n"
        "  - {name: b, transformer: 'deployments.models:Square', batching: *fast, "
        "inputs: *in, outputs: *out}\n")
    assert [m.batching.max_batch_size for m in load_config(shared).models] == [8, 8]


def test_import_object_says_what_failed():
    assert import_object("deployments.models:Square").__name__ == "Square"
    with pytest.raises(ConfigError, match=r"cannot import 'deployments\.models:Nope'"):
        import_object("deployments.models:Nope")


def test_batching_kind_picks_the_policy_and_a_wrong_kind_is_named():
    base = {"name": "m", "transformer": "x:Y",
            "inputs": [{"name": "i", "datatype": "INT32", "shape": [-1, 1]}],
            "outputs": [{"name": "o", "datatype": "INT32", "shape": [-1, 1]}]}
    kinds = {"dynamic": {}, "sequence": {"kind": "sequence", "strategy": "oldest"},
             "iterative": {"kind": "iterative", "max_active": 4}}
    for kind, block in kinds.items():
        config = load_config({"models": [{**base, "batching": block}]})
        assert config.models[0].batching.kind == kind
    with pytest.raises(ConfigError, match=r"models\.0\.batching\.kind='sequnce': must be one of"):
        load_config({"models": [{**base, "batching": {"kind": "sequnce"}}]})
    with pytest.raises(ConfigError, match=r"models\.0\.batching\.max_active=0"):
        load_config({"models": [{**base, "batching": {"kind": "iterative", "max_active": 0}}]})


@pytest.mark.parametrize("old, new", [
    ("deployments.stateful_models:Accumulator", "deployments.models:Accumulator"),
    ("deployments.tinylm:TinyLM", "deployments.models:TinyLM"),
])
def test_an_import_path_that_moved_names_the_new_one(old, new):
    with pytest.raises(ConfigError) as e:
        load_config({"models": [{**MODEL, "transformer": old}]})
    assert f"write '{new}' instead" in str(e.value)
    assert import_object(new).__name__ == new.rpartition(":")[2]


# -- limits: bounded by default ------------------------------------------------------------
def _model(**fields) -> ModelConfig:
    return ModelConfig.model_validate({
        "name": "m", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}], **fields})


def test_every_queue_is_bounded_by_default_from_batch_size_and_replicas():
    m = _model(batching={"max_batch_size": 32, "priority_levels": 2,
                         "priority_queue_policy": {1: {"max_queue_size": 5}}},
               replicas={"max_replicas": 3})
    p = m.bounded().batching
    # admitted by time (limits.max_queue_wait_s, 1 s): the count bound is a memory guard
    assert p.max_queue_wait_s == 1.0
    assert p.default_queue_policy.max_queue_size == 64 * 32 * 3
    assert p.priority_queue_policy[1].max_queue_size == 5  # one set by hand is kept
    assert m.batching.default_queue_policy.max_queue_size is None  # the original: untouched
    assert m.max_request_items == 16 * 32


def test_the_default_bound_follows_queue_batches_and_can_be_turned_off():
    m = _model(batching={"max_batch_size": 4}, limits={"queue_batches": 2,
                                                       "max_queue_wait_s": None,
                                                       "max_request_items": 9})
    assert m.bounded().batching.default_queue_policy.max_queue_size == 2 * 4 * 1
    assert m.bounded().batching.max_queue_wait_s is None  # admission by count
    assert m.max_request_items == 9
    off = _model(limits={"queue_batches": None, "max_queue_wait_s": None})
    assert off.bounded().batching.default_queue_policy.max_queue_size is None


def test_the_wait_bound_is_written_into_the_policy_unless_it_sets_its_own():
    m = _model(batching={"max_batch_size": 4}, limits={"max_queue_wait_s": 0.25,
                                                       "guard_batches": 3})
    p = m.bounded().batching
    assert p.max_queue_wait_s == 0.25 and p.default_queue_policy.max_queue_size == 3 * 4
    own = _model(batching={"max_batch_size": 4, "max_queue_wait_s": 2.0})
    assert own.bounded().batching.max_queue_wait_s == 2.0
    # set in the policy alone (limits.max_queue_wait_s: null): still admitted by time
    alone = _model(batching={"max_batch_size": 4, "max_queue_wait_s": 2.0},
                   limits={"max_queue_wait_s": None, "guard_batches": None})
    assert alone.bounded().batching.default_queue_policy.max_queue_size is None
    assert m.bounded().bounded() == m.bounded()  # applied twice: the same
    with pytest.raises(ValidationError, match="max_queue_wait_s"):
        _model(limits={"max_queue_wait_s": 0})


def test_stateful_and_generative_models_are_bounded_in_their_own_units():
    seq = _model(batching={"kind": "sequence", "max_batch_size": 4},
                 replicas={"max_replicas": 2})
    assert seq.bounded().batching.max_pending_sequences == 8 * 4 * 2
    gen = _model(batching={"kind": "iterative", "max_active": 16})
    assert gen.bounded().batching.max_queue_size == 8 * 16
    given = _model(batching={"kind": "iterative", "max_active": 16, "max_queue_size": 3})
    assert given.bounded().batching.max_queue_size == 3


def test_limits_are_validated_with_the_field_named():
    with pytest.raises(ValidationError, match="queue_batches"):
        _model(limits={"queue_batches": 0})
    with pytest.raises(ValidationError, match="max_request_items"):
        _model(limits={"max_request_items": 0})
def test_placement_ingress_takes_every_kind_and_has_no_shards():
    for batching in ({}, {"kind": "sequence"}, {"kind": "iterative"}):
        cfg = load_config({"models": [{**MODEL, "batching": batching,
                                       "batcher": {"placement": "ingress"}}]})
        assert cfg.models[0].batcher.placement == "ingress"
    bad(r"batcher.shards=2 with batcher.placement='ingress'",
        batcher={"placement": "ingress", "shards": 2})
    bad(r"batcher.shards=2 with batcher.placement='ingress'",
        batching={"kind": "sequence"}, batcher={"placement": "ingress", "shards": 2})


def test_a_stateful_model_runs_in_the_ingress_only_with_one_ingress_replica():
    def config(replicas: int, kind: str, placement: str) -> dict:
        return {"ingress": {"num_replicas": replicas},
                "models": [{**MODEL, "batching": {"kind": kind},
                            "batcher": {"placement": placement}}]}

    with pytest.raises(ConfigError, match=r"models \['square'\] are stateful .*placement="
                       r"'ingress', and ingress.num_replicas=2: .*different ingress replicas"
                       r".*set ingress.num_replicas to 1, or batcher.placement to 'actor'"):
        load_config(config(2, "sequence", "ingress"))
    load_config(config(1, "sequence", "ingress"))
    load_config(config(2, "sequence", "actor"))
    load_config(config(3, "iterative", "ingress"))  # each generation is self-contained
    bad(r"placement='ingres': must be 'actor' or 'ingress'", batcher={"placement": "ingres"})


def test_placement_left_out_is_ingress_for_one_shard_of_dynamic_batching_else_actor():
    def placement(**model) -> str:
        return load_config({"models": [{**MODEL, **model}]}).models[0].batcher.placement

    assert placement() == "ingress"
    assert placement(batcher={"shards": 2}) == "actor"
    assert placement(batching={"kind": "sequence"}) == "actor"
    assert placement(batching={"kind": "iterative"}) == "actor"
    assert placement(batcher={"placement": "actor"}) == "actor"


def test_in_process_replicas_take_nothing_a_process_of_their_own_would():
    ok = _model(replicas={"in_process": True, "num_cpus": 0.5, "max_replicas": 3})
    assert ok.replicas.host_cpus() == 1.5 and ok.replicas.host_cpus(parts=2) == 1.0
    assert _model(replicas={"num_cpus": 0.5}).replicas.host_cpus() == 0.0  # actors: own ask
    for extra, named in (({"num_gpus": 1}, "num_gpus=1"), ({"pin": "required", "num_cpus": 1},
                                                           "pin='required'"),
                         ({"resources": {"numa0": 1}}, "resources="), ({"env": {"A": "1"}},
                                                                       "env=")):
        bad(rf"in_process=true with {named}.*set in_process to false",
            replicas={"in_process": True, **extra})


def test_the_engines_process_reserves_its_in_process_replicas_cpus():
    inproc = {"in_process": True, "num_cpus": 0.25, "max_replicas": 2}
    cfg = load_config({"ingress": {"num_cpus": 0.5, "num_replicas": 2}, "models": [
        {**MODEL, "name": "a", "replicas": inproc},  # in the ingress: 1 of 2 replicas each
        {**MODEL, "name": "b", "replicas": {"num_cpus": 1}},  # its own actors
        {**MODEL, "name": "c", "replicas": inproc,
         "batcher": {"placement": "actor", "num_cpus": 0.1}}]})
    assert cfg.ingress_num_cpus == 0.5 + 0.25
    _, b, c = cfg.models
    assert c.batcher_num_cpus == 0.1 + 0.5 and b.batcher_num_cpus == 0.0  # b: no actor


@pytest.mark.parametrize("ingress, words", [
    ({"native_port": 8000}, "Serve's HTTP port"),
    ({"native_port": 9000}, "Serve's gRPC port"),
    ({"native_port": 0}, "native_port"),
])
def test_the_native_servers_port_is_a_port_of_its_own(ingress, words):
    with pytest.raises(ConfigError) as e:
        load_config({"ingress": ingress, "models": []})
    assert words in str(e.value)


def test_the_native_server_is_off_unless_a_port_is_given():
    assert load_config({"models": []}).ingress.native_port is None
    assert load_config({"ingress": {"native_port": 8080}, "models": []}).ingress.native_port \
        == 8080


def test_the_server_name_is_raybatch_unless_set_and_never_empty():
    assert load_config({"models": []}).ingress.server_name == "raybatch"
    assert load_config({"ingress": {"server_name": "triton"}, "models": []}
                       ).ingress.server_name == "triton"
    with pytest.raises(ConfigError, match="server_name"):
        load_config({"ingress": {"server_name": ""}, "models": []})
