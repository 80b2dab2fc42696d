"""``python -m loadtests soak`` (``soak``): ZEO clients' RSS over a long run at a fixed request rate
(``traffic``: the paced requests; ``summary``: figures, report and plot from the samples)."""
