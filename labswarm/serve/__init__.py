"""Serving trained models over HTTP (issue 25): ``POST /v1/models/{job}/predict`` on the manager
(:mod:`labswarm.serve.routes`) and alone (``labswarm serve``, :mod:`labswarm.serve.app`)."""
