"""The Celery app, the broker settings (RabbitMQ or the embedded SQLite broker), the compute task, the worker."""
