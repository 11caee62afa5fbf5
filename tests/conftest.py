import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def central_differences(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every entry of x (changed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


@pytest.fixture
def numeric_grad():
    return central_differences
