"""Code that runs only inside a job's learner process: the entry point, the trainer's job hooks, the reporter."""
