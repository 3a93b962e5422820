"""Large tensors out of band on a direct connection (`deployments.wire.codec`): what goes
in band and what does not, arrays made over the received frame without a copy and
writable, hostile payloads refused (a fixed seed); and over real sockets, a batch of
large arrays to each kind of actor side (the batching actor's asyncio `LinkServer`, the
replica's `ThreadedLinkServer`) and back, the model writing to its inputs in place."""

from __future__ import annotations

import asyncio
import pickle
import random
import struct

import numpy as np
import pytest

from deployments.replica.link_server import ThreadedLinkServer
from deployments.wire.codec import KIND, OOB, OOB_MIN_BYTES, decode, encode
from deployments.wire.link import HEAD, INFER, REPLY, Link, LinkServer
from tests.conftest import arun as run


def joined(value) -> tuple[int, bytearray]:
    flag, parts = encode(value)
    return flag, bytearray(b"".join(parts))


def test_small_values_stay_one_in_band_part_as_before():
    value = {"x": np.arange(16, dtype=np.float32), "keys": [1, 2, 3]}
    flag, parts = encode(value)
    assert flag == 0 and len(parts) == 1 and pickle.loads(parts[0])["keys"] == [1, 2, 3]
    assert decode(parts[0], 0)["x"].tolist() == list(range(16))


def test_large_arrays_go_out_of_band_and_come_back_over_the_frame_without_a_copy():
    big = np.arange(64 * 1024, dtype=np.float32).reshape(256, 256)
    value = ("batch", [big, np.ones(8, np.int64)], {"b": big[:128]})
    flag, parts = encode(value)
    assert flag == OOB and len(parts) == 2 + 2  # counts+lengths, pickle, two buffers
    assert parts[2].nbytes == big.nbytes  # the array as it lies, not a copy of it
    _, frame = joined(value)
    out = decode(frame, OOB)
    assert out[0] == "batch" and np.array_equal(out[1][0], big)
    assert np.array_equal(out[2]["b"], big[:128]) and out[1][1].tolist() == [1] * 8
    assert np.shares_memory(out[1][0], np.frombuffer(frame, np.uint8))  # made over the frame
    out[1][0][0, 0] = -1.0  # writable, as an in-band array is
    assert frame != joined(value)[1]


def test_a_read_only_frame_gives_writable_arrays():
    big = np.ones(OOB_MIN_BYTES, np.uint8)
    _, frame = joined([big])
    (out,) = decode(bytes(frame), OOB)
    out[0] = 7
    assert out.flags.writeable and out.sum() == big.sum() + 6


@pytest.mark.parametrize("make", [
    lambda: np.asfortranarray(np.arange(40000, dtype=np.float64).reshape(200, 200)),
    lambda: np.arange(80000, dtype=np.float64)[::2],  # not contiguous: numpy pickles a copy
    lambda: np.zeros((0, 4096), np.float32),
    lambda: np.array(["a" * 5000, "b"], dtype=object),
])
def test_every_layout_comes_back_equal(make):
    value = make()
    flag, frame = joined(value)
    out = decode(frame, flag)
    assert out.dtype == value.dtype and out.shape == value.shape
    assert np.array_equal(out, value)
    if value.flags.c_contiguous or value.flags.f_contiguous:  # else a copy, made contiguous
        assert out.flags.f_contiguous == value.flags.f_contiguous


def _globals(main: bytes) -> list[str]:
    """The names a pickle looks up: each STACK_GLOBAL's module and name, the last two
    strings pushed before it (memoized strings fetched again count too)."""
    import pickletools

    strings: list[str] = []
    memo: list[str | None] = []  # what each MEMOIZE stored, if a string
    names, pushed = [], None
    for op, arg, _ in pickletools.genops(main):
        if op.name == "MEMOIZE":
            memo.append(pushed)
        elif op.name in ("BINGET", "LONG_BINGET") and memo[arg] is not None:
            strings.append(memo[arg])
        elif op.name == "STACK_GLOBAL":
            names.append(".".join(strings[-2:]))
        pushed = arg if isinstance(arg, str) and "UNICODE" in op.name else None
        if pushed is not None:
            strings.append(pushed)
    return names


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2", "u1", "?", "<c8", "S7", "<U3",
                                   ">i8"])
def test_plain_dtypes_travel_by_their_string_and_come_back_exact(dtype):
    rng = np.random.default_rng(3)
    value = rng.integers(0, 100, size=(3, 4096)).astype(dtype)
    for big in (value, value[:1, :8]):  # out of band, and in band
        flag, parts = encode(big)
        main = parts[1] if flag else parts[0]
        names = _globals(bytes(main))
        assert not any(n.endswith(".dtype") for n in names), names  # no dtype object
        out = decode(bytearray(b"".join(parts)), flag)
        assert out.dtype == big.dtype and out.dtype.str == np.dtype(dtype).str
        assert out.shape == big.shape and np.array_equal(out, big) and out.flags.writeable
        assert pickle.loads(main, buffers=[bytearray(p) for p in parts[2:]]).dtype == big.dtype


@pytest.mark.parametrize("make", [
    lambda: np.zeros(5000, dtype=[("a", "<f4"), ("b", "<i8")]),  # structured
    lambda: np.arange(5000).astype("<M8[ns]"),  # dates: no buffer of theirs
    lambda: np.arange(5000).astype("<m8[s]"),
    lambda: np.zeros(5000, dtype=np.dtype("<f8", metadata={"unit": "m"})),
    lambda: np.asfortranarray(np.arange(6000, dtype=np.float32).reshape(60, 100)),
])
def test_other_arrays_are_reduced_as_numpy_reduces_them(make):
    value = make()
    flag, parts = encode(value)
    out = decode(bytearray(b"".join(parts)), flag)
    assert out.dtype == value.dtype and out.dtype.metadata == value.dtype.metadata
    assert np.array_equal(out, value) and out.flags.f_contiguous == value.flags.f_contiguous


def test_random_arrays_come_back_as_numpy_s_own_pickle_gives_them():
    """A differential, fixed seed: any dtype (plain, dates, objects, records), shape (empty
    and 0-d included), layout (strided, transposed) and writability; what the codec
    decodes has the dtype, bytes and writability a plain `pickle` round trip gives, and an
    array seen twice in a value is one array again."""
    rng = np.random.default_rng(7)
    dtypes = ["<f4", ">f4", "<f8", "<f2", "<i1", ">i4", "<i8", "u1", ">u8", "?", "<c8",
              ">c16", "S3", "<U5", "<M8[s]", "<m8[ms]", "O", [("a", "<i4"), ("b", "S2")]]
    for _ in range(300):
        dt = np.dtype(dtypes[rng.integers(len(dtypes))])
        shape = tuple(int(n) for n in rng.integers(0, 40, size=rng.integers(0, 4)))
        if dt.kind == "O":
            a = np.empty(shape, dtype=object)
            a.flat[:] = [str(i) for i in range(a.size)]
        else:
            raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
            a = np.frombuffer(raw.tobytes(), dtype=dt).reshape(shape).copy()
        if rng.random() < 0.3 and a.ndim and a.shape[0] > 1:
            a = a[::2]
        if rng.random() < 0.2 and a.ndim == 2:
            a = a.T
        if rng.random() < 0.2:
            a.flags.writeable = False
        flag, parts = encode({"x": a, "again": (a, 1)})
        out = decode(bytearray(b"".join(parts)), flag)
        got, ref = out["x"], pickle.loads(pickle.dumps(a, protocol=5))
        assert got.dtype == ref.dtype and got.shape == a.shape and out["again"][0] is got
        if dt.kind == "O":
            assert list(got.flat) == list(a.flat)
        else:
            assert got.tobytes() == ref.tobytes()
        assert got.flags.writeable == ref.flags.writeable  # read-only stays so, as pickled


class _Registered:
    def __init__(self, v):
        self.v = v


def test_a_type_registered_with_copyreg_after_the_codec_loaded_is_reduced_by_it():
    """The codec's pickler sees copyreg's table as it is now, not as it was at import."""
    import copyreg

    copyreg.pickle(_Registered, lambda o: (_Registered, (o.v * 10,)))
    try:
        flag, parts = encode([_Registered(2), np.ones(3)])
        out = decode(bytearray(b"".join(parts)), flag)
    finally:
        del copyreg.dispatch_table[_Registered]
    assert out[0].v == 20 and out[1].tolist() == [1.0, 1.0, 1.0]


def test_a_payload_whose_lengths_do_not_add_up_is_refused():
    _, frame = joined([np.ones(OOB_MIN_BYTES, np.uint8)])
    cases = {
        "short": frame[:5],
        "one byte more": frame + b"x",
        "one byte less": frame[:-1],
        "a huge count": struct.pack("<II", 1 << 31, 0) + frame[8:],
        "a huge length": frame[:8] + struct.pack("<Q", 1 << 62) + frame[16:],
    }
    for name, payload in cases.items():
        with pytest.raises(ValueError):
            decode(payload, OOB)
        assert name


def test_random_out_of_band_payloads_raise_and_never_hang():
    rng = random.Random(11)
    _, good = joined([np.arange(OOB_MIN_BYTES, dtype=np.uint8), "tail"])
    for _ in range(2000):
        payload = bytearray(good)
        for _ in range(rng.randint(1, 8)):  # flip, cut or grow a few bytes
            what = rng.random()
            at = rng.randrange(len(payload))
            if what < 0.6:
                payload[at] = rng.randrange(256)
            elif what < 0.8:
                del payload[at:at + rng.randint(1, 64)]
            else:
                payload[at:at] = rng.randbytes(rng.randint(1, 64))
        try:
            decode(payload, OOB)
        except Exception:  # any error: the connection is then closed
            pass


# -- over real sockets ----------------------------------------------------------------
def _inplace(batch: list[np.ndarray]) -> list[np.ndarray]:
    """A model that writes to its inputs: each array times 10, in place."""
    for x in batch:
        x *= 10
    return batch


def test_a_batch_of_large_arrays_to_a_replica_and_back():
    server = ThreadedLinkServer(_inplace, workers=1)
    host, port, token = server.address("127.0.0.1")
    arrays = [np.full((512, 256), i, np.float32) for i in range(3)]  # 512 KiB each

    async def main():
        link = await Link.open_to(host, port, token)
        out = await link.call(arrays)
        small = await link.call([np.ones(4, np.float32)])
        link.close()
        return out, small

    try:
        out, small = run(main())
    finally:
        server.close()
    assert [float(x[0, 0]) for x in out] == [0.0, 10.0, 20.0] and small[0].tolist() == [10.0] * 4
    assert all(x.shape == (512, 256) for x in out) and arrays[1][0, 0] == 1.0  # sent, not lent


def test_a_bundle_of_large_arrays_to_a_batching_actor_and_back():
    seen = []

    async def infer(bundle, caller=None, sent=None):
        seen.append(all(x.flags.writeable for x in bundle))
        return _inplace(bundle)

    async def cancel(*args):
        return 0

    async def main():
        server = LinkServer(infer, cancel)
        host, port, token = await server.address("127.0.0.1")
        link = await Link.open_to(host, port, token)
        out = await asyncio.gather(*(link.call([np.full(20000, i, np.float64)], "c", None)
                                     for i in range(4)))
        link.close()
        server.close()
        return out

    out = run(main())
    assert [float(o[0][0]) for o in out] == [0.0, 10.0, 20.0, 30.0] and all(seen)


def test_a_hand_made_out_of_band_frame_is_read_by_the_replica_side():
    """The frame layout, byte for byte, as `deployments.wire.codec` documents it."""
    import socket

    server = ThreadedLinkServer(lambda xs: [x + 1 for x in xs], workers=1)
    host, port, token = server.address("127.0.0.1")
    data = np.arange(OOB_MIN_BYTES // 4, dtype=np.float32)
    main = pickle.dumps(([data],), protocol=5, buffer_callback=lambda b: False)
    payload = struct.pack("<IIQ", 1, len(main), data.nbytes) + main + data.tobytes()
    try:
        with socket.create_connection((host, port)) as sock:
            sock.sendall(token + HEAD.pack(len(payload), 5, INFER | OOB) + payload)
            head = b""
            while len(head) < HEAD.size:
                head += sock.recv(HEAD.size - len(head))
            n, cid, kind = HEAD.unpack(head)
            body = bytearray()
            while len(body) < n:
                body += sock.recv(n - len(body))
    finally:
        server.close()
    assert cid == 5 and kind & KIND == REPLY and kind & OOB
    (out,) = decode(body, kind & OOB)
    assert np.array_equal(out, data + 1)


def test_frames_read_in_pieces_of_any_size_come_whole_big_or_small():
    """The loop's reads end anywhere: in a head, in a small payload, in a large one (read
    into a buffer of its own). Every frame comes whole, in order, for 20 random cuts."""
    from deployments.wire.link import BIG_FRAME, _frame, _Framing

    class Catch(_Framing):
        def __init__(self) -> None:
            super().__init__()
            self.got: list[tuple[int, int, bytes]] = []

        def frame(self, cid, kind, payload):
            self.got.append((cid, kind, bytes(payload)))

    class Open:
        def is_closing(self) -> bool:
            return False

    rng = random.Random(5)
    sizes = [0, 10, BIG_FRAME - 1, BIG_FRAME, 3, BIG_FRAME + 1, 1 << 20, 7, 2 * BIG_FRAME]
    frames = [(i + 1, REPLY | (OOB if i % 2 else 0), rng.randbytes(n))
              for i, n in enumerate(sizes)]
    stream = b"".join(_frame(*f) for f in frames)
    for _ in range(20):
        catch = Catch()
        catch.connection_made(Open())
        at = 0
        while at < len(stream):
            into = catch.get_buffer(-1)
            n = min(len(into), rng.choice([1, 13, 4096, 70000, 300000]), len(stream) - at)
            into[:n] = stream[at:at + n]
            catch.buffer_updated(n)
            at += n
        assert catch.got == frames


def test_large_answers_read_one_after_another_keep_their_own_values():
    """Each large answer is read into a buffer of its own, on both sides: one still held is
    never overwritten by the next."""
    server = ThreadedLinkServer(lambda xs: [x * 2 for x in xs], workers=1)
    host, port, token = server.address("127.0.0.1")

    async def main():
        link = await Link.open_to(host, port, token)
        held = [await link.call([np.full(1 << 18, i, np.float32)]) for i in range(6)]
        link.close()
        return held

    try:
        held = run(main())
    finally:
        server.close()
    assert [float(h[0][0]) for h in held] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(float(h[0].min()) == float(h[0].max()) for h in held)


@pytest.mark.parametrize("rows", [1, 64])  # in band, and out of band (64 KiB)
def test_a_lone_read_only_request_sent_to_a_replica_is_written_by_its_model(rows):
    """The path where a batch of one request is the sender's read-only array: a frame of
    the direct connection to a replica's `ThreadedLinkServer`, as `ModelReplica.run`
    runs it."""
    from batching.model import run_batch
    from tests.unit.batching.test_model_inputs import Doubler, received

    model = Doubler()
    server = ThreadedLinkServer(lambda items: (run_batch(model, items), 0.0), workers=1)
    host, port, token = server.address("127.0.0.1")
    x = received(np.arange(rows * 256)).reshape(rows, 256)

    async def main():
        link = await Link.open_to(host, port, token)
        try:
            return await link.call(x)
        finally:
            link.close()

    try:
        out, _ = run(main())
    finally:
        server.close()
    assert np.array_equal(out, np.arange(rows * 256, dtype=np.float32).reshape(rows, 256) * 2)
