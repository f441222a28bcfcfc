"""A Django 6 project whose tasks run on Rota: TASKS names RotaBackend."""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "dbname=shop"))

SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["orders"]
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}

TASKS = {
    "default": {
        "BACKEND": "rota.contrib.django.RotaBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    }
}
