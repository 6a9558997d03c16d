"""The comparison of the distributed training frameworks on one workload (``labswarm compare``)."""
