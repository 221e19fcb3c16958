"""A TCP relay that delays every byte by a fixed time in each direction: round trips as on a
real network, for the comparison harness's `--rtt` (`run.sh`). One process for the whole fleet.

    python3 delay.py DELAY_MS LISTEN_PORT TO_PORT ADDRESS...

For each ADDRESS it listens on ADDRESS:LISTEN_PORT and relays each connection to
ADDRESS:TO_PORT, holding each chunk DELAY_MS before passing it on (order kept, bandwidth not
limited). Prints "ready" once every address listens.
"""

import asyncio
import sys


async def pump(reader, writer, delay):
    queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def deliver():
        while True:
            at, data = await queue.get()
            wait = at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:
                try:
                    writer.write_eof()
                except OSError:
                    pass
                return
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data or None))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()


async def main():
    delay = float(sys.argv[1]) / 1000.0
    listen, to = int(sys.argv[2]), int(sys.argv[3])
    addresses = sys.argv[4:]

    def handler(address):
        async def handle(reader, writer):
            try:
                up_reader, up_writer = await asyncio.open_connection(address, to)
            except OSError:
                writer.close()
                return
            await asyncio.gather(
                pump(reader, up_writer, delay),
                pump(up_reader, writer, delay),
                return_exceptions=True,
            )
            writer.close()
            up_writer.close()

        return handle

    servers = [
        await asyncio.start_server(handler(a), a, listen, backlog=1024) for a in addresses
    ]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
