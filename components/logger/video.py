"""Videos: checking and laying out uint8 frames, writing MP4s (``imageio-ffmpeg``) or GIFs, and recording env frames
into one video."""

from __future__ import annotations

import math
import os
from typing import Any

import torch


def video_frames(video: torch.Tensor) -> torch.Tensor:
    """Check a uint8 ``T x C x H x W`` video (or ``N x T x C x H x W``, laid out as a grid); return ``T x H x W x C``.

    Raises:
        TypeError: not a uint8 tensor of 4 or 5 dimensions.
    """
    if not isinstance(video, torch.Tensor) or video.dtype != torch.uint8 or video.dim() not in (4, 5):
        got = f"{video.dtype} {list(video.shape)}" if isinstance(video, torch.Tensor) else type(video).__name__
        raise TypeError(f"log_video needs a uint8 tensor T x C x H x W or N x T x C x H x W, got {got}")
    video = video.detach().cpu()
    if video.dim() == 5:  # N videos side by side: a grid with ceil(sqrt(N)) columns
        n, t, c, h, w = video.shape
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        grid = torch.zeros((t, c, rows * h, cols * w), dtype=torch.uint8)
        for i in range(n):
            r, q = divmod(i, cols)
            grid[:, :, r * h : (r + 1) * h, q * w : (q + 1) * w] = video[i]
        video = grid
    return video.permute(0, 2, 3, 1).contiguous()


def write_gif(frames: torch.Tensor, path: str, fps: int) -> str:
    """Write ``T x H x W x C`` uint8 frames (C = 1 or 3) as an animated GIF; return the path."""
    from PIL import Image

    images = [Image.fromarray(f.squeeze(-1).numpy() if f.shape[-1] == 1 else f.numpy()) for f in frames]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=max(1, int(1000 / fps)), loop=0)
    return path


def can_write_mp4() -> bool:
    """Whether an MP4 encoder is installed (``imageio-ffmpeg``, which ships its own ffmpeg: the ``video`` extra)."""
    import importlib.util

    return importlib.util.find_spec("imageio_ffmpeg") is not None


def write_mp4(frames: torch.Tensor, path: str, fps: int) -> str:
    """Write ``T x H x W x C`` uint8 frames (C = 1 or 3) as an H.264 MP4 with ffmpeg (``imageio-ffmpeg``); return the
    path. Odd sizes are padded by one black row or column (the encoder's 4:2:0 sampling needs even ones)."""
    import imageio_ffmpeg

    array = frames.numpy()
    if array.shape[-1] == 1:
        array = array.repeat(3, axis=-1)
    t, h, w, _ = array.shape
    if h % 2 or w % 2:
        padded = torch.zeros((t, h + h % 2, w + w % 2, 3), dtype=torch.uint8).numpy()
        padded[:, :h, :w] = array
        array = padded
    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = imageio_ffmpeg.write_frames(path, (array.shape[2], array.shape[1]), fps=fps, codec="libx264",
                                         pix_fmt_out="yuv420p", macro_block_size=1, ffmpeg_log_level="error")
    writer.send(None)  # start the encoder
    try:
        for frame in array:
            writer.send(frame.copy(order="C"))
    finally:
        writer.close()
    return path


def write_video(frames: torch.Tensor, path_without_suffix: str, fps: int) -> str:
    """Write the frames as MP4 where an encoder is installed, else as an animated GIF; return the file's path."""
    if can_write_mp4():
        return write_mp4(frames, path_without_suffix + ".mp4", fps)
    return write_gif(frames, path_without_suffix + ".gif", fps)


class VideoRecorder:
    """Collects environment frames and logs them as one video.

    Args:
        logger: a logger owner (its client is used) or a logger client.
        tag: the video's name.
        fps: frames per second of the written video.

    Examples:
        >>> recorder = VideoRecorder(logger_owner, tag="eval/video", fps=30)
        >>> recorder.record(env.render())          # H x W x C uint8, or N x H x W x C for vector envs
        >>> path = recorder.flush(step=1000)
    """

    def __init__(self, logger: Any, tag: str, fps: int = 30):
        from ..service import Owner

        self.logger = logger.client() if isinstance(logger, Owner) else logger
        self.tag, self.fps = tag, fps
        self.frames: list[torch.Tensor] = []

    def record(self, frame) -> None:
        """Keep one frame (or one frame per vector env) for the next `flush`.

        Raises:
            TypeError: ``frame`` is not uint8 ``H x W x C`` or ``N x H x W x C``.
        """
        frame = torch.as_tensor(frame)
        if frame.dtype != torch.uint8 or frame.dim() not in (3, 4):
            raise TypeError(f"frames must be uint8 H x W x C (or N x H x W x C), got {frame.dtype} {list(frame.shape)}")
        self.frames.append(frame)

    def flush(self, step: int | None = None) -> str | None:
        """Log the recorded frames as a video (a grid for vector envs) and start afresh; returns the artifact path."""
        if not self.frames:
            return None
        video = torch.stack(self.frames)  # T x H x W x C or T x N x H x W x C
        video = video.permute(0, 3, 1, 2) if video.dim() == 4 else video.permute(1, 0, 4, 2, 3)
        self.frames = []
        return self.logger.log_video(self.tag, video.contiguous(), step=step, fps=self.fps)
