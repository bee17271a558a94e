from typing import Any

from ctlplane._native import ConsumerShardServer as ConsumerShardServer
from ctlplane._native import ControlClient as ControlClient
from ctlplane._native import EventInbox as EventInbox

ControlRequest = dict[str, Any]
ControlResponse = dict[str, Any]

def make_cancel_request(
    transfer_id: str,
    reservation_id: str = "",
    *,
    abandon: bool = False,
    refresh: bool = False,
) -> ControlRequest: ...
from ctlplane._native import ConsumerControlServer as ConsumerControlServer
