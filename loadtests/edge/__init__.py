"""``python -m loadtests attacks``: the edge tried as an attacker would (``attacks`` runs the
cases of ``wire``, ``cases``, ``blobs`` and ``bypass``)."""
