"""Users, API tokens, the dashboard's cookie and the request limits: the manager's authentication, a leaf package."""
