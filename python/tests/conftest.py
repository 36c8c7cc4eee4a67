import os

import numpy as np
import pytest


@pytest.fixture
def rng():
    seed = int(os.environ.get("RLX_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))
    print(f"RLX_TEST_SEED={seed}")
    return np.random.default_rng(seed)
