import numpy as np

from perencode.kinds.scoring import dl_distance, dl_distances


def test_dl_known_answers():
    assert dl_distance([1, 2, 3], [1, 2, 3]) == 0
    assert dl_distance([1, 2, 3], [1, 3, 2]) == 1      # one transposition
    assert dl_distance([1, 2, 3], [1, 2]) == 1         # deletion
    assert dl_distance([1, 2, 3], [4, 5, 6]) == 3      # substitutions
    assert dl_distance([], [7, 7]) == 2
    # unrestricted DL: "CA" -> "ABC" is 2 (OSA would say 3)
    assert dl_distance([3, 1], [1, 2, 3]) == 2


def test_dl_rows_cut_to_length():
    pred = np.array([[1, 2, 9, 9], [4, 3, 0, 0]])
    tgt = np.array([[1, 2, 5, 5], [3, 4, 0, 0]])
    assert dl_distances(pred, tgt, np.array([2, 2])).tolist() == [0, 1]
    assert dl_distances(pred, tgt, np.array([4, 4])).tolist() == [2, 1]
