import numpy as np
import pytest
from datasketch.lsh import _optimal_param

from operators.dedup.lsh import band_keys, candidate_probability, optimal_bands


@pytest.mark.parametrize("threshold,num_perm,weights", [(0.5, 128, (0.5, 0.5)), (0.8, 128, (0.5, 0.5)), (0.7, 256, (0.3, 0.7)), (0.9, 64, (0.5, 0.5))])
def test_optimal_bands_match_datasketch(threshold, num_perm, weights):
    ours = optimal_bands(threshold, num_perm, false_positive_weight=weights[0], false_negative_weight=weights[1])
    assert ours == _optimal_param(threshold, num_perm, *weights)


def test_band_keys_match_exactly_when_a_band_matches():
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 2**32, (3, 12), dtype=np.uint64).astype(np.uint32)
    sig[1, 4:8] = sig[0, 4:8]  # docs 0 and 1 share band 1 only
    sig[2, 0:4] = sig[0, 4:8]  # doc 2 has doc 0's band-1 values in band 0: must not match
    keys = band_keys(sig, 3, 4)
    assert keys.shape == (3, 3) and keys.dtype == np.int64
    assert keys[0, 1] == keys[1, 1]
    assert keys[0, 0] != keys[1, 0] and keys[0, 2] != keys[1, 2]
    assert keys[2, 0] != keys[0, 1]


def test_band_parameters_are_validated():
    with pytest.raises(ValueError, match="needs 130"):
        band_keys(np.zeros((1, 128), np.uint32), 13, 10)
    with pytest.raises(ValueError, match="threshold"):
        optimal_bands(1.5, 128)
    assert candidate_probability(1.0, 9, 13) == 1.0
