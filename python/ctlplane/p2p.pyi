from ctlplane._native import ZmqConnection as ZmqConnection
from ctlplane._native import ZmqTransport as ZmqTransport
