import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def assert_exact_mass_conservation(model, iterations: int, rng) -> None:
    """Drive a sparse model with small-integer gradients (every float32 sum is exact) and check
    result + Σ residuals == Σ (gradients + old residuals) exactly, and its own invariants."""
    p, n = model.residuals.shape
    for _ in range(iterations):
        g = rng.integers(-8, 9, (p, n)).astype(np.float32)
        old = model.residuals.copy()
        r = model.step(g)
        lhs = r.result[0].astype(np.float64) + r.residuals.astype(np.float64).sum(0)
        assert np.array_equal(lhs, (g.astype(np.float64) + old).sum(0))
        assert all(r.info["invariants"].values())
