import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.tasks import TaskResultStatus

from orders.models import Order
from orders.tasks import send_receipt


def place_order(request: HttpRequest) -> JsonResponse:
    """The order and its receipt's job commit together, or neither does."""
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=body["email"], total_cents=body["total_cents"])
        result = send_receipt.enqueue(order.id)
    return JsonResponse({"order": order.id, "receipt": result.id})


def receipt(request: HttpRequest, result_id: str) -> JsonResponse:
    result = send_receipt.get_result(result_id)
    body = {"status": result.status}
    if result.status == TaskResultStatus.SUCCESSFUL:
        body["receipt"] = result.return_value
    return JsonResponse(body)
