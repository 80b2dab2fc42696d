"""Statistics every tool shares: percentiles (of values, and of a latency histogram), Little's
law, and a figure measured once per round as its spread (median, min, max).
"""
import numpy as np


# ----------------------------------------------------------------------------- percentiles

def percentile(values, fraction):
    """Nearest-rank percentile: the smallest of ``values`` with at least ``fraction``
    (0 < fraction <= 1) of them at or below it (numpy's ``inverted_cdf``). ``values`` need
    not be sorted. Returns a Python number, or None when ``values`` is empty."""
    if len(values) == 0:
        return None
    return np.quantile(np.asarray(values), fraction, method="inverted_cdf").item()


def littles_law(connections, rps, p99):
    """``{"littles_law_mean_s", "p99_over_littles_mean"}`` of a closed-loop run: the mean
    latency (seconds) ``connections`` must show at ``rps`` requests/s if every connection is
    served in turn (Little's law: connections / rps), and the p99 latency ``p99`` (seconds)
    over it, a measure of unfairness (1 is as fair as a queue gets). Rounded to 3 and 2
    places; None where rps is 0 (or ``p99`` None: no completed request)."""
    little = connections / rps if rps else None
    return {"littles_law_mean_s": round(little, 3) if little else None,
            "p99_over_littles_mean": round(p99 / little, 2) if little and p99 is not None else None}


def merge_histograms(histograms):
    """One Locust histogram ``{ms (int): count}`` summing ``histograms`` (an iterable of
    ``{rounded ms: count}``; keys may be strings, as in JSON)."""
    merged = {}
    for histogram in histograms:
        for ms, count in histogram.items():
            merged[int(ms)] = merged.get(int(ms), 0) + count
    return merged


def histogram_percentile(histogram, fraction):
    """Response time (ms) within which ``fraction`` (0..1) of the requests finished, from
    Locust's histogram ``{rounded ms: count}`` (keys may be strings, as in JSON).

    Same rule as ``locust.stats.calculate_response_time_percentile`` (so the reports agree
    with Locust's own): the bucket holding request number ``int(total * fraction) + 1``
    counted from the fastest. Locust itself cannot be imported here (it monkey-patches the
    process with gevent). Returns an int, or None for an empty histogram.
    """
    counts = {int(ms): n for ms, n in histogram.items()}
    keys = np.array(sorted(counts), dtype=np.int64)
    cumulative = np.cumsum([counts[k] for k in keys.tolist()])
    if not len(keys) or cumulative[-1] == 0:
        return None
    index = np.searchsorted(cumulative, int(cumulative[-1] * fraction), side="right")
    return int(keys[min(index, len(keys) - 1)])


# ----------------------------------------------------------------------------- reports

def spread(values):
    """``{"median", "min", "max"}`` of ``values`` (numbers, rounded to 2 places), or None
    when empty: how a figure measured once per round is reported."""
    if not values:
        return None
    return {"median": round(float(np.median(values)), 2), "min": round(float(min(values)), 2),
            "max": round(float(max(values)), 2)}


def format_spread(value, digits=0):
    """``"median (min–max)"`` of a :func:`spread` with ``digits`` decimals and thousands
    separators, or ``"-"`` for None."""
    if value is None:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    return f"{fmt.format(value['median'])} ({fmt.format(value['min'])}–{fmt.format(value['max'])})"
