import pytest

from perencode.common.console import fit_name

NAME = "vocab_size=32/encoding=none/seed=111"


def test_a_name_that_fits_is_unchanged():
    assert fit_name(NAME, len(NAME)) == NAME
    assert fit_name("seed=1", 80) == "seed=1"


def test_the_middle_goes_first():
    assert fit_name(NAME, 24) == "vocab_size=32/…/seed=111"
    assert fit_name(NAME, 30) == "vocab_size=32/encodi…/seed=111"


@pytest.mark.parametrize("width", range(0, len(NAME) + 1))
def test_fits_and_keeps_the_seed(width):
    short = fit_name(NAME, width)
    assert len(short) <= width
    if width >= len("…seed=111"):
        assert short.endswith("seed=111")
    if width >= len("v…/seed=111"):
        assert short.startswith(NAME[:width - len("…/seed=111")])


def test_rows_that_differ_by_seed_stay_apart_at_any_width():
    names = [f"vocab_size=1024/encoding=sinusoidal/seed={s}" for s in (111, 222, 333)]
    for width in range(5, 50):
        assert len({fit_name(n, width) for n in names}) == 3
