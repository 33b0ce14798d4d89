"""Celery projects laid out as users lay them out, for the deployment-shape tests.

- ``djproj``: a Django-style project: the app module installs the router first, then
  reads a namespaced settings module and autodiscovers tasks.
- ``pubsite`` / ``plainsite``: publisher-only codebases that send tasks by name, with and
  without the router.
- ``docworker`` / ``plainworker``: worker codebases that define the tasks, with and without
  the router.

Everything is configured from the environment the tests set (``BROKER_URL``,
``RESULT_BACKEND``, ``DOCUMENT_QUEUE`` and ``PRIORITY_ROUTER_*``).
"""
