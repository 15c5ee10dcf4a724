"""Which replica of a model answers a request: prefix-cache affinity under bounded load.

``prefix`` (hashing a request's conversation into blocks), ``index`` (which replica holds
which blocks), ``policy`` (the pure choice), ``ledger`` (what a replica reports about its
own cache), ``registry`` (replica counts for scale-to-zero), ``router`` (the Ray Serve
``RequestRouter`` adapter).
"""
