"""`helm test`: every node agent behind the headless Service answers /readyz with 200.

Usage: python3 readyz-check.py HOST PORT.  HOST resolves to one address per
agent (the Service lists agents that are not ready too), so a node whose
agent is not ready fails the test, and its /readyz body, which names each
simulator that is not ready and why, is printed.  Standard library only: it
runs in the node agent image, in a pod that has nothing else.
"""

import socket
import sys
import urllib.error
import urllib.request


def main(host: str, port: int) -> int:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        print(f"no node agent behind {host}: {error}")
        return 1
    failed = 0
    addresses = sorted({info[4][0] for info in infos})
    for address in addresses:
        netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        try:
            with urllib.request.urlopen(f"http://{netloc}/readyz", timeout=10) as answer:
                status, body = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, body = error.code, error.read()
        except OSError as error:
            status, body = None, str(error).encode()
        print(f"{address}: {status} {body.decode(errors='replace')}")
        failed += status != 200
    print(f"{len(addresses) - failed} of {len(addresses)} node agents ready")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
