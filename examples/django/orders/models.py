from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.IntegerField()
