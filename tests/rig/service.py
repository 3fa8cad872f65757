"""What the rig starts (a metastore, Redis servers, an S3 server), as a ``with`` block."""

from __future__ import annotations

from typing import Any, Self


class Service:
    """``start()`` on the way in, ``stop()`` on the way out, and ``stop()`` as well when
    ``start()`` fails halfway (whatever it had started goes)."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
