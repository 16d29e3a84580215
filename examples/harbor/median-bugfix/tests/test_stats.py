import random
import statistics
import sys

sys.path.insert(0, "/app/src")
import stats  # noqa: E402


def test_median_odd_and_even():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    rng = random.Random(5)
    for _ in range(200):
        xs = [rng.randint(-50, 50) for _ in range(rng.randint(1, 12))]
        assert stats.median(xs) == statistics.median(xs), xs


def test_mode():
    assert stats.mode([]) is None
    assert stats.mode([2, 1, 2, 1, 3]) == 1
    assert stats.mode([7]) == 7


def test_mean_unchanged():
    assert stats.mean([1, 2, 3, 4]) == 2.5
