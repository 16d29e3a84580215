"""`ADD URL DEST`: the host downloads the file while building (only in a build allowed network).

Docker's rules, kept: an http(s) URL, one file, mode 0600 unless `--chmod`, never unpacked
(a remote archive stays an archive); `--checksum=sha256:HEX` is verified. How the layer cache
treats it (`build.py`):

* with `--checksum`: the layer is keyed by the URL and the checksum, so a cached rebuild does
  not download at all and a fresh one is verified against the checksum (a mismatch is an error
  naming the line, with both digests): reproducible;
* without: the build cannot know what the URL serves today, so it downloads it on every build
  and keys the layer by the sha256 of the bytes it got (as Docker does). Identical bytes reuse
  the cached layer and image; changed bytes make a new layer and a new image digest. Such an
  image is not reproducible from its Dockerfile (the log of every build says so), and a
  cached rebuild costs a download.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request

MAX_FETCH_BYTES = 512 << 20
FETCH_TIMEOUT_S = 120.0


class FetchError(RuntimeError):
    """The download failed, was too large or did not match its checksum."""


def fetch(url: str, checksum: str | None, where: str) -> bytes:
    """The bytes `url` serves (`where` names the Dockerfile line in errors)."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_FETCH_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"{where}: ADD {url}: download failed: {e}") from None
    if len(data) > MAX_FETCH_BYTES:
        raise FetchError(f"{where}: ADD {url}: larger than {MAX_FETCH_BYTES >> 20} MiB")
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if checksum is not None and got != checksum:
        raise FetchError(f"{where}: ADD {url}: checksum mismatch: the Dockerfile says {checksum}, "
                         f"the download is {got}")
    return data
