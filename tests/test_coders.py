"""Blocks get coders whose size estimate does not pickle them (issue 15:
Beam's output counters sampled every ~10 MB block through pickle)."""

import numpy as np
import apache_beam as beam

from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.transforms import coders
from dpsynth.transforms.aggregate import Block, PrepareBlocks
from dpsynth.transforms.io import InputSpec, ReadEmbeddingBlocks
from dpsynth.transforms.progress import ProgressFile, ReportProgress


def block(n=4096, d=384) -> Block:
    rng = np.random.default_rng(0)
    return Block(rng.standard_normal((n, d)), np.arange(n) % 3,
                 rng.standard_normal((n, 8)), np.arange(n, dtype=np.int64))


def test_estimates_do_not_encode(monkeypatch):
    b, raw = block(), (np.ones((4096, 384)), np.zeros(4096, np.int64))
    impls = [beam.coders.registry.get_coder(Block).get_impl(),
             beam.coders.registry.get_coder(coders.RAW_BLOCK).get_impl()]

    def no_pickle(*_a, **_k):
        raise AssertionError("estimate_size pickled the block")
    monkeypatch.setattr(coders.pickle, "dumps", no_pickle)
    assert impls[0].estimate_size(b) >= b.x.nbytes + b.z.nbytes
    assert impls[1].estimate_size(raw) >= raw[0].nbytes + raw[1].nbytes


def test_blocks_round_trip():
    b = block(10, 4)
    got = beam.coders.registry.get_coder(Block).decode(
        beam.coders.registry.get_coder(Block).encode(b))
    for field in ("x", "y", "z", "codes"):
        np.testing.assert_array_equal(getattr(got, field), getattr(b, field))
    raw_coder = beam.coders.registry.get_coder(coders.RAW_BLOCK)
    x, y = raw_coder.decode(raw_coder.encode((b.x, b.y)))
    np.testing.assert_array_equal(x, b.x)
    np.testing.assert_array_equal(y, b.y)


def test_block_pcollections_carry_the_array_coders(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, embeddings=np.ones((5, 4)), labels=np.zeros(5, np.int64))
    cfg = GeneratorConfig(epsilon=1.0, delta=1e-5, labels=(0,))
    p = beam.Pipeline()
    raw = p | ReadEmbeddingBlocks(InputSpec(str(path)))
    reported = raw | ReportProgress(ProgressFile(str(tmp_path / "p")), "x")
    prepared = reported | PrepareBlocks(cfg, 4)
    for pcoll in (raw, reported):
        assert str(beam.coders.registry.get_coder(pcoll.element_type)) == \
            "TupleCoder[ArraysCoder, ArraysCoder]"
    assert isinstance(beam.coders.registry.get_coder(prepared.element_type),
                      coders.ArraysCoder)
