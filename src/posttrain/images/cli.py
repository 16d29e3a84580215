"""`posttrain image build|list|prune`: images built from Dockerfiles without a daemon."""

from __future__ import annotations

import time
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Images: build Dockerfiles (or Harbor task folders) without Docker; list, "
                       "prune the layer cache.")


def _dockerfiles(path: Path) -> list[Path]:
    """DIR/Dockerfile, DIR/environment/Dockerfile (a Harbor task), or those of every task
    folder in DIR; a file is taken as it is."""
    if path.is_file():
        return [path]
    for candidate in (path / "Dockerfile", path / "environment" / "Dockerfile"):
        if candidate.is_file():
            return [candidate]
    found = sorted(p for p in path.glob("*/environment/Dockerfile"))
    return found


@app.command()
def build(paths: list[Path] = typer.Argument(..., help="a Dockerfile, a folder with one, a "
                                             "Harbor task folder, or a folder of task folders"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the digests"),
          network: bool = typer.Option(False, "--network", help="RUN steps may use the host's "
                                       "network (package registries) while building; never "
                                       "episodes; the layer cache does not depend on it")) -> None:
    """Build each image (cached steps cost a lookup); exits 1 if any build failed."""
    from posttrain.images.build import BuildError
    from posttrain.images.build import build as run_build
    from posttrain.images.dockerfile import DockerfileError

    failed = 0
    for path in paths:
        files = _dockerfiles(path)
        if not files:
            typer.echo(f"posttrain image build: {path}: no Dockerfile there (nor in "
                       "environment/ or */environment/)", err=True)
            failed += 1
        for dockerfile in files:
            t0 = time.monotonic()
            try:
                image = run_build(dockerfile, log=None if quiet else typer.echo, network=network)
            except (BuildError, DockerfileError, OSError) as e:
                typer.echo(f"posttrain image build: {e}", err=True)
                failed += 1
                continue
            if quiet:
                typer.echo(image.digest)
            else:
                typer.echo(f"{image.digest}  {dockerfile}  ({image.base_note}; "
                           f"{len(image.layers)} layers, {time.monotonic() - t0:.2f} s)")
    if failed:
        raise typer.Exit(1)


@app.command("list")
def list_() -> None:
    """The built images, newest first."""
    from posttrain.images.store import cache_dir, list_images, tree_bytes

    images = list_images()
    typer.echo(f"{'digest':24s}  {'layers':>6s}  {'MB':>8s}  {'user':8s}  {'workdir':12s}  source")
    for image in images:
        size = sum(tree_bytes(p) for p in image.layers) / 1e6
        typer.echo(f"{image.digest:24s}  {len(image.layers):6d}  {size:8.1f}  "
                   f"{image.user or 'root':8s}  {image.workdir:12s}  {image.source}")
    typer.echo(f"{len(images)} images in {cache_dir()}")


@app.command()
def prune(all_: bool = typer.Option(False, "--all", help="remove every image too")) -> None:
    """Delete layers no image uses and leftovers of killed builds (--all: everything)."""
    from posttrain.images.store import prune as run_prune

    removed = run_prune(everything=all_)
    typer.echo(", ".join(f"{n} {kind}" for kind, n in removed.items()) + " removed")
