"""What a training job is: its states and transitions, error codes and exit codes, the results store's layout."""
