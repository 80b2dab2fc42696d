"""``python -m loadtests cache`` (``cachebench``): the cache tier on vs off through the HTTPS edge."""
