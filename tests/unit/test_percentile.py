import pytest

from berth_tools.loadtest.submit_latency import percentile


def test_nearest_rank_percentiles() -> None:
    data = [float(i) for i in range(1, 201)]
    assert percentile(data, 50) == 100.0
    assert percentile(data, 99) == 198.0
    assert percentile(data, 100) == 200.0
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
