"""Signal-driven receive on the SBA-200 model: ~30 us more per end than polling
(paper 000 §4.2.3)."""

from __future__ import annotations

import pytest
import trio

from stacklib.recipes import load_recipe
from stacklib.sim import Simulation
from stacklib.unet import Endpoint, UpcallCondition, connect


def round_trip(use_signals: bool) -> float:
    recipe = load_recipe("sba200")
    sim = Simulation(seed=1)
    rtts: list[float] = []

    async def main() -> None:
        cluster = recipe.transport.build(sim, recipe.transport_params, ["a", "b"], None)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        ping = a.os.create_endpoint(a.os.process("ping"))
        pong = b.os.create_endpoint(b.os.process("pong"))
        to_pong, _ = connect(ping, pong)
        done = trio.Event()

        def echo(ep: Endpoint) -> None:
            while (message := ep.poll()) is not None:
                ep.send_nowait(message.channel, message.data)

        def answered(ep: Endpoint) -> None:
            while ep.poll() is not None:
                done.set()

        if use_signals:
            pong.set_upcall(UpcallCondition.NON_EMPTY, echo)
            ping.set_upcall(UpcallCondition.NON_EMPTY, answered)
            start = trio.current_time()
            ping.send_nowait(to_pong, b"x" * 40)
            await done.wait()
        else:
            async with trio.open_nursery() as nursery:

                async def polling_echo() -> None:
                    message = await pong.recv()
                    await pong.send(message.channel, message.data)

                nursery.start_soon(polling_echo)
                start = trio.current_time()
                await ping.send(to_pong, b"x" * 40)
                await ping.recv()
        rtts.append((trio.current_time() - start) * 1e6)

    sim.run(main)
    return rtts[0]


def test_signals_add_about_30_us_per_end() -> None:
    polling = round_trip(use_signals=False)
    signals = round_trip(use_signals=True)
    # Two signals of 30 us, less the message-level host costs the upcall path does not pay
    # (its handlers use poll and send_nowait): 1.5 us to send and 1.0 us to receive per end.
    assert signals - polling == pytest.approx(2 * 30.0 - 2 * (1.5 + 1.0), abs=0.01)
