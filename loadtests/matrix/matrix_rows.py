"""The matrix report's rows (aggregated cells, dicts): a row's label, whether it is the base
variant of its cell (direct, blob-sendfile on), the rows at each server's default threads,
and the formatting of a row's figures, flags and errors in the tables.
"""
ERROR_KINDS = ("connect", "read", "write", "timeout")


def label(row):
    """A cell's server as the tables and plots name it: the wsgi-server value, then
    ``sendfile off``, ``cache <size>`` (its zodb-cache-size) and ``×n via HAProxy`` for the
    cells off the default axes."""
    text = row["server"]
    if not row.get("sendfile", True):
        text += " sendfile off"
    if row.get("cache", 0):
        text += f" cache {row['cache']:,}"
    if row.get("clients", 0):
        text += f" ×{row['clients']} via HAProxy"
    return text


def is_base(row):
    """True for a direct cell of a default-built client (clients 0, sendfile on, the build's
    zodb-cache-size): the cells the per-server tables compare."""
    return not row.get("clients", 0) and row.get("sendfile", True) and not row.get("cache", 0)


def default_threads_rows(rows, single_threaded, base_only=True):
    """The rows at each server's default threads (2, or 1 when single-threaded): one line
    per server in the per-connection plots; ``base_only``: direct to a default-built
    client only (:func:`is_base`)."""
    return [r for r in rows if r["threads"] == (1 if r["server"] in single_threaded else 2)
            and (is_base(r) or not base_only)]


def _fmt(value):
    return "" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _flags(row):
    """The marks of a cell in the summary tables: U not steady, B backlog, ! noisy."""
    return "".join(mark for mark, on in (("U", not row["steady"]), ("B", row["backlog"]), ("!", row["noisy"])) if on)


def _errors(row):
    return sum(row[f"err_{k}"] for k in ERROR_KINDS) + row["non_2xx"]
