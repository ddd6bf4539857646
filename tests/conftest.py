import os

import hypothesis
import numpy as np
import pytest

hypothesis.settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True)
hypothesis.settings.register_profile("dev", max_examples=80, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)
