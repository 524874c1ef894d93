"""The one request table (supervisor.daemon.requests) routes exactly the protocol's requests: every
control command, and the bus requests and no others."""

from supervisor.daemon.requests import ROUTES
from supervisor.wire import protocol


def test_the_table_routes_every_control_command_and_bus_request_and_nothing_else():
    assert set(ROUTES) == set(protocol.COMMANDS)
    assert {name for name, route in ROUTES.items() if route.bus} == set(
        protocol.REQUEST_TOPICS.values()
    )
