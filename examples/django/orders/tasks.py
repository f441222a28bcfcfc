"""The project's tasks: plain Django 6 tasks, run by `rota worker --django`."""

from django.tasks import TaskContext, task

from orders.models import Order


@task(queue_name="emails", priority=20)
def send_receipt(order_id: int) -> dict[str, object]:
    order = Order.objects.get(pk=order_id)
    # A real project sends the email here.
    return {"to": order.email, "total": order.total_cents / 100}


@task(takes_context=True)
def refund(context: TaskContext, order_id: int) -> str:
    if context.attempt < 2:
        raise ConnectionError("payment provider timed out")
    return f"order {order_id} refunded on attempt {context.attempt}"
