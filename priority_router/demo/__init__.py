"""``priority-router demo``: the noisy-neighbour problem and its fix, on this machine.

Installed with the package, so the command runs from a wheel as from a checkout:

- ``run``: the demo itself (two runs, plain Celery then the router, and the report);
- ``app``: the Celery app factory, configured from the environment (the repository's
  example workers, ``workers/app.py``, use it too);
- ``worker``: the app the demo's workers run (``celery -A priority_router.demo.worker``),
  with the demo's one task;
- ``documents``: what a document task does and how the workload is published;
- ``local_redis``: the three Redis databases the demo uses, and a throwaway redis-server.
"""
