"""The jobs' lifecycle: the periodic pass, deploys, restarts and outcomes, a distributed job's cluster."""
