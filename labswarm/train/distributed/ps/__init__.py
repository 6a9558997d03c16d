"""The parameter server: shard processes (:mod:`.server`, run with ``python -m labswarm.train.distributed.ps``) and the
learners' client (:mod:`.client`), over a small framed-TCP transport (:mod:`.protocol`) whose connections start
with the job secret's handshake (:mod:`.auth`). Needs torch."""

from labswarm.train.distributed.ps.client import ParameterServerClient, ParameterServerError, assign_shards

__all__ = ["ParameterServerClient", "ParameterServerError", "assign_shards"]
