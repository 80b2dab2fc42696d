"""Reports and plots: the report folder (``var/reports/<subcommand>-<YYYYmmdd-HHMMSS>/``),
``report.json``, ``report.md`` and the PNGs (``write_report``, ``finish_report``), Markdown
tables (``markdown_table``), matplotlib figures on the Agg backend (``new_figure``,
``save_figure``) and bars with their spread (``spread_bars``).
"""
import datetime
import json
import os
import re


def new_figure(rows=1, cols=1, figsize=(6, 4)):
    """``(fig, axes)`` of ``matplotlib.pyplot.subplots(rows, cols, figsize=figsize)`` (inches)
    on the Agg backend: files only, no display. matplotlib is imported here, on the first
    plot, so tools and tests that draw nothing do not load it. Pair with ``save_figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=figsize)


def save_figure(fig, path, dpi=100):
    """Lay ``fig`` out, write it to ``path`` (PNG, ``dpi`` dots per inch) and close it (pyplot
    keeps every open figure in memory)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


_FIGURE = re.compile(r"(-|-?[\d,]*\.?\d+%?)?")  # blank cells count as figures


def spread_bars(ax, labels, series, capsize=3):
    """Grouped bars on the matplotlib axes ``ax``: one group per x label of ``labels``, one
    bar per entry of ``series`` (``[(legend name, {label: spread or None})]``, spreads as
    :func:`spread` returns) at its median with a min–max whisker; a missing spread leaves a
    gap. Sets the x ticks to ``labels``; scale, titles and legend are the caller's."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series):
        xs, ys, low, high = [], [], [], []
        for j, label in enumerate(labels):
            value = values.get(label)
            if value:
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(value["median"])
                low.append(value["median"] - value["min"])
                high.append(value["max"] - value["median"])
        ax.bar(xs, ys, width, yerr=[low, high], capsize=capsize, label=name)
    ax.set_xticks(range(len(labels)), list(labels))


def markdown_table(headers, rows):
    """Markdown table text (no trailing newline): ``headers`` the column titles, ``rows``
    lists of cells, one per header.

    A cell shows as ``str(cell)``, except None as ``-`` and ints with thousands separators
    (``12,345``). A column is right-aligned when all its cells are figures (numbers, None, or
    text such as ``1,234.5``, ``49.9%`` or ``-``), left-aligned otherwise. Raises ValueError
    for a row of the wrong length.
    """
    def numeric(cell):
        if isinstance(cell, str):
            return _FIGURE.fullmatch(cell) is not None
        return cell is None or (isinstance(cell, (int, float)) and not isinstance(cell, bool))

    def show(cell):
        if cell is None:
            return "-"
        if isinstance(cell, int) and not isinstance(cell, bool):
            return f"{cell:,}"
        return str(cell)

    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row of {len(row)} cells for {len(headers)} columns: {row!r}")
    aligns = ["---:" if all(numeric(row[i]) for row in rows) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(aligns) + "|"]
    lines += ["| " + " | ".join(show(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def report_folder(out, subcommand, started=None):
    """``<out>/<subcommand>-<YYYYmmdd-HHMMSS>`` (``started`` a datetime, default now),
    created; returns its path."""
    started = started or datetime.datetime.now()
    folder = os.path.join(out, f"{subcommand}-{started.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(folder, exist_ok=True)
    return folder


def write_report(folder, data, markdown, plots=()):
    """Write ``report.json`` (``data``, indent 2, keys in their order) and ``report.md``
    (``markdown``, a str) into ``folder``, then each plot of ``plots``, pairs ``(file name,
    function(path))``, drawn after the text files so a failing plot leaves the figures on
    disk. Returns the paths written: JSON, Markdown, then the plots."""
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, "report.json"), os.path.join(folder, "report.md")]
    with open(paths[0], "w", encoding="utf-8") as fp:
        json.dump(data, fp, indent=2)
    with open(paths[1], "w", encoding="utf-8") as fp:
        fp.write(markdown)
    for name, draw in plots:
        paths.append(os.path.join(folder, name))
        draw(paths[-1])
    return paths


def finish_report(folder, data, markdown, plots=(), problems=()):
    """End of a subcommand's run: :func:`write_report` into ``folder``, then print the
    Markdown, one ``problem: ...`` line per entry of ``problems`` (str) and the folder.
    Returns the exit status: 1 when there were problems, else 0."""
    write_report(folder, data, markdown, plots)
    print(markdown)
    for problem in problems:
        print(f"problem: {problem}")
    print(f"report: {folder}")
    return 1 if problems else 0
