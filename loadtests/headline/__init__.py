"""``python -m loadtests headline`` (``headline``): the docs' headline figures in one run; the
``blob-sendfile = off`` clients it builds beside the stack are ``offclients``'."""
