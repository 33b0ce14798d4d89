"""``proj/celery.py`` as Django projects write it, with the router installed first."""

from celery import Celery

from priority_router import PriorityRouter

app = Celery("djproj")
# Installed before the configuration exists, as in many projects' app modules.
PriorityRouter.from_env().install(app)
app.config_from_object("shapes.djproj.settings", namespace="CELERY")
app.autodiscover_tasks(["shapes.djproj.documents"])
