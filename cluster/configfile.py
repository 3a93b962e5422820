"""Reading a config file: YAML text to plain data, or a ConfigError that says what is wrong
with the file (missing, unreadable, too large, not UTF-8, not YAML, nested past what the
parser can follow, or aliases that expand past any config's size).

A config is read whole into memory, validated and written out again (Serve config, k8s
manifests), each walking every value. YAML aliases that refer to aliases multiply a
file's size at each level (ten levels of ten: ten billion values from a few hundred
bytes), so what the data expands to is counted before anything walks it, without
expanding it: each distinct list or mapping is counted once and its count reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cluster.modelpath import ConfigError

MAX_CONFIG_VALUES = 1_000_000
MAX_CONFIG_BYTES = 16 << 20  # read no more of a file than this (`--config /dev/zero`)


def read_yaml(path: Path) -> Any:
    """The data of the YAML file at `path`; ConfigError for anything a config cannot be."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path} is more than {MAX_CONFIG_BYTES >> 20} MiB: a config is a "
                              "YAML file of a few kilobytes (is it the right file?)")
        data = yaml.safe_load(raw.decode("utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): "
                          "a config is a YAML file") from None
    except OSError as e:  # a folder, no permission
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    except RecursionError:
        raise ConfigError(f"{path} nests lists or mappings deeper than the YAML parser can "
                          "follow: a config is a few levels deep") from None
    values = expanded_size(data)
    if values > MAX_CONFIG_VALUES:
        raise ConfigError(
            f"{path} holds {values:,} values once its YAML aliases (*name) are expanded, more "
            f"than a config can ({MAX_CONFIG_VALUES:,}): an alias of an alias of a list grows "
            "without bound; write the values out, or use fewer levels of aliases")
    return data


def expanded_size(data: Any) -> int:
    """How many values `data` holds with every shared list or mapping counted each time it
    appears (as validation and rendering will walk it)."""
    sizes: dict[int, int] = {}

    def size(value: Any) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        known = sizes.get(id(value))
        if known is None:
            children = value.values() if isinstance(value, dict) else value
            known = sizes[id(value)] = 1 + sum(size(v) for v in children)
        return known

    return size(data)
