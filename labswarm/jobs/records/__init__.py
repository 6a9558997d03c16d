"""What the manager's database holds of the training jobs, shared by the service (:mod:`labswarm.jobs.service`)
and the lifecycle (:mod:`labswarm.jobs.lifecycle`): the tables, the event stream with its one write point of a
job's state, and each attempt's own API token."""
