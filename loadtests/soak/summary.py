"""The soak's figures from its samples, its report.md and its plot; pure functions of the samples.

A sample (``report.json``'s ``samples``) is ``{"t_s": seconds since the traffic started,
"requests": {client: answers that passed the check so far}, "errors": {client: failed ones so
far}, "rss_bytes": {client: RSS of its process tree in bytes, None once it is gone}}``; the
first is taken before the first request, the last after the last answer.
"""
from loadtests.core.reports import markdown_table, new_figure, save_figure

MiB = 1024 * 1024
KiB = 1024


def growth_per_1000(points):
    """Least-squares slope of RSS over requests, in bytes per 1,000 requests, of ``points``
    (``[(requests, rss bytes)]``), or None with fewer than two distinct request counts."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return round(slope * 1000)


def summarize(samples, names, after_requests):
    """``{client: figures}`` for each of ``names`` from ``samples`` (module docstring):

    - ``requests``, ``errors``: at the end; ``seconds``: the last sample's time;
      ``rps``: requests / seconds;
    - ``rss_start_bytes``: the first sample's RSS (before any request);
    - ``rss_after_bytes`` and ``after_at_requests``: RSS and requests of the first sample
      with at least ``after_requests`` requests (None, None when none reached them);
    - ``rss_end_bytes``: the last RSS sampled; ``rss_peak_bytes``: the largest;
    - ``growth_bytes_per_1000``: :func:`growth_per_1000` of the samples from that first
      one on (the growth once the caches are filled), None without two of them.
    """
    out = {}
    for name in names:
        rows = [(s["t_s"], s["requests"][name], s["rss_bytes"][name]) for s in samples]
        sized = [(requests, rss) for _, requests, rss in rows if rss is not None]
        after = next(((requests, rss) for requests, rss in sized if requests >= after_requests), None)
        seconds = rows[-1][0] if rows else 0.0
        requests = rows[-1][1] if rows else 0
        out[name] = {
            "requests": requests,
            "errors": samples[-1]["errors"][name] if samples else 0,
            "seconds": round(seconds, 1),
            "rps": round(requests / seconds, 2) if seconds > 0 else None,
            "rss_start_bytes": rows[0][2] if rows else None,
            "rss_after_bytes": after[1] if after else None,
            "after_at_requests": after[0] if after else None,
            "rss_end_bytes": sized[-1][1] if sized else None,
            "rss_peak_bytes": max(rss for _, rss in sized) if sized else None,
            "growth_bytes_per_1000": growth_per_1000([p for p in sized if p[0] >= after_requests]),
        }
    return out


def _mib(value):
    return None if value is None else round(value / MiB, 1)


def to_markdown(meta, summary):
    """report.md: the settings, then one row per client (``meta["clients"]``: ``{client:
    {"url", "server", "allocator", "late", "max_lag_s"}}``) with its figures from ``summary``."""
    after = meta["after_requests"]
    rows = []
    for name, figures in summary.items():
        client = meta["clients"][name]
        growth = figures["growth_bytes_per_1000"]
        rows.append([name, client.get("server") or "-", client.get("allocator") or "-", figures["requests"],
                     figures["errors"], client.get("late", 0), figures["rps"], _mib(figures["rss_start_bytes"]),
                     _mib(figures["rss_after_bytes"]), _mib(figures["rss_end_bytes"]),
                     _mib(figures["rss_peak_bytes"]), None if growth is None else round(growth / KiB, 1)])
    return "\n".join([
        f"# Soak: RSS of {len(summary)} ZEO client(s) against requests served ({meta['started']})",
        "",
        f"`{meta['command']}`: {meta['rate']:g} requests/s per client for {meta['duration_s']:g} s, the paths "
        f"{', '.join(meta['paths'])} in turn, at most {meta['workers']} at once per client, straight to each client; "
        f"RSS of each client's process tree every {meta['interval_s']:g} s. Machine: {meta['cores']} cores, "
        f"load average {meta['load_before']} before and {meta['load_after']} after.",
        "",
        markdown_table(["client", "server", "allocator", "requests", "errors", "late", "req/s", "RSS start MiB",
                        f"RSS after {after:,} requests MiB", "RSS end MiB", "RSS peak MiB",
                        "growth KiB per 1,000 requests"], rows),
        "",
        f"RSS start: before the first request. RSS after {after:,} requests: the first sample at or after "
        f"{after:,} requests served (`-`: fewer served). Growth: the least-squares slope of RSS over requests "
        "served from that sample to the end. Late: requests that started more than 1 s after they were due "
        "(the client was slower than the rate). URLs: "
        + ", ".join(f"{name} {client['url']}" for name, client in meta["clients"].items()) + ".",
        "",
    ])


def plot(samples, labels, after_requests, path):
    """RSS (MiB) against requests served, one line per client (``labels``: ``{client: legend
    text}``), a dotted line at ``after_requests``; written to ``path`` (PNG)."""
    fig, ax = new_figure(figsize=(7, 4.5))
    for name, label in labels.items():
        points = [(s["requests"][name], s["rss_bytes"][name] / MiB) for s in samples
                  if s["rss_bytes"][name] is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], marker=".", markersize=3, label=label)
    if any(s["requests"][name] >= after_requests for s in samples for name in labels):
        ax.axvline(after_requests, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("requests served")
    ax.set_ylabel("RSS of the process tree (MiB)")
    ax.set_title("ZEO clients' RSS over a soak")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
