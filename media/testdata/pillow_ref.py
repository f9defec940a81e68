"""Writes test images and preprocesses them as Kimi K3's released processor
does, with Pillow, for media's comparison test (pillow_test.go).

Usage: pillow_ref.py OUTDIR

For every case it writes the image file, NAME.rgb (the resized image after
the transparent-background fill, RGB bytes, before padding), for small cases
NAME.f32 (the padded, normalised patches, float32 little-endian,
[patches, 3, 14, 14]), for JPEG and lossy WebP NAME.dec (Pillow's decoded,
EXIF-transposed pixels as RGB, to tell decoder differences from
preprocessing ones), and cases.json describing them.

The steps follow the released KimiK3VisionProcessor with its published
media_proc_cfg (in_patch_limit 65536, patch_size 14, merge 2, 512 patches a
side, chessboard 8 px of 255/180 with white top-left, filled after the
resize, mean 0.5, std 0.5). numpy is not needed: the float32 arithmetic of
the released numpy code is reproduced with struct (one rounding per
operation, as numpy does).
"""

import io
import json
import math
import random
import struct
import sys

from PIL import Image, ImageDraw, ImageOps

PATCH, MERGE, IN_PATCH_LIMIT, SIDE_LIMIT = 14, 2, 65536, 512
SQUARE, WHITE, GRAY = 8, 255, 180


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def plan(width, height):
    s1 = math.sqrt(IN_PATCH_LIMIT / (max(1.0, width // PATCH) * max(1.0, height // PATCH)))
    s2 = SIDE_LIMIT * PATCH / width
    s3 = SIDE_LIMIT * PATCH / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), SIDE_LIMIT * PATCH)
    new_h = min(max(1, int(height * scale)), SIDE_LIMIT * PATCH)
    factor = MERGE * PATCH
    return new_w, new_h, (factor - new_w % factor) % factor, (factor - new_h % factor) % factor


# COMPOSITE[bg][a][c]: the released code's float32 alpha * c + (1 - alpha) * bg,
# truncated to uint8 (astype), one table per background value.
def _composite_table(bg):
    table = []
    for a in range(256):
        alpha = f32(a / 255.0)
        rest = f32(f32(1.0 - alpha) * bg)
        table.append(bytes(min(255, int(f32(f32(alpha * c) + rest))) for c in range(256)))
    return table


COMPOSITE = {WHITE: _composite_table(WHITE), GRAY: _composite_table(GRAY)}


def fill_transparent_background(image):
    if image.mode == "RGB":
        return image
    if "A" not in image.getbands() and "transparency" not in image.info:
        return image.convert("RGB")
    rgba = image.convert("RGBA").tobytes()
    w, h = image.size
    out = bytearray(3 * w * h)
    for y in range(h):
        for x in range(w):
            i = y * w + x
            bg = GRAY if ((x // SQUARE + y // SQUARE) % 2 == 1) else WHITE
            row = COMPOSITE[bg][rgba[4 * i + 3]]
            out[3 * i] = row[rgba[4 * i]]
            out[3 * i + 1] = row[rgba[4 * i + 1]]
            out[3 * i + 2] = row[rgba[4 * i + 2]]
    return Image.frombytes("RGB", (w, h), bytes(out))


NORM = [struct.pack("<f", f32(f32(f32(v / 255.0) - 0.5) * 2.0)) for v in range(256)]


def patches(rgb, w, h, pad_w, pad_h):
    pw, ph = w + pad_w, h + pad_h
    out = []
    for py in range(ph // PATCH):
        for px in range(pw // PATCH):
            for c in range(3):
                for dy in range(PATCH):
                    y = py * PATCH + dy
                    for dx in range(PATCH):
                        x = px * PATCH + dx
                        v = rgb[3 * (y * w + x) + c] if x < w and y < h else 0
                        out.append(NORM[v])
    return b"".join(out)


def preprocess(path, outbase, want_f32, want_dec):
    im = Image.open(path)
    im = ImageOps.exif_transpose(im)
    if want_dec:
        with open(outbase + ".dec", "wb") as f:
            f.write(im.convert("RGB").tobytes())
    w, h = im.size
    new_w, new_h, pad_w, pad_h = plan(w, h)
    im = im.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    im = fill_transparent_background(im)
    rgb = im.tobytes()
    with open(outbase + ".rgb", "wb") as f:
        f.write(rgb)
    if want_f32:
        with open(outbase + ".f32", "wb") as f:
            f.write(patches(rgb, new_w, new_h, pad_w, pad_h))
    return {"width": w, "height": h, "resized_w": new_w, "resized_h": new_h,
            "grid_w": (new_w + pad_w) // PATCH, "grid_h": (new_h + pad_h) // PATCH}


def content(w, h, seed):
    """Smooth colour from a small random image, with sharp lines and boxes so
    the bicubic overshoot (clipping) is exercised."""
    rnd = random.Random(seed)
    sw, sh = max(1, w // 16), max(1, h // 16)
    small = Image.frombytes("RGB", (sw, sh), bytes(rnd.randrange(256) for _ in range(3 * sw * sh)))
    im = small.resize((w, h), Image.Resampling.BILINEAR)
    d = ImageDraw.Draw(im)
    for _ in range(40):
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        x1, y1 = x0 + rnd.randrange(1, 60), y0 + rnd.randrange(1, 60)
        colour = tuple(rnd.choice((0, 255, rnd.randrange(256))) for _ in range(3))
        if rnd.random() < 0.5:
            d.line((x0, y0, x1, y1), fill=colour, width=rnd.randrange(1, 4))
        else:
            d.rectangle((x0, y0, x1, y1), fill=colour)
    return im


def alpha_channel(w, h, seed):
    rnd = random.Random(seed)
    a = Image.linear_gradient("L").resize((w, h))
    d = ImageDraw.Draw(a)
    for _ in range(30):
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        d.rectangle((x0, y0, x0 + rnd.randrange(1, 40), y0 + rnd.randrange(1, 40)), fill=rnd.choice((0, 255, 128)))
    return a


def exif_bytes(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def make_cases(outdir):
    cases = []

    def add(name, im, fmt, small=False, dec=False, **save):
        path = f"{outdir}/{name}"
        if fmt == "PNG":
            save.setdefault("compress_level", 1)  # fast: the files are temporary
        im.save(path, fmt, **save)
        cases.append((name, small, dec))

    # Downscaled by the patch budget (76,398 patches) and by the side limit.
    add("rgb_5000x3000.png", content(5000, 3000, 1), "PNG")
    add("rgb_7300x300.png", content(7300, 300, 2), "PNG")
    # Kept, only padded.
    add("rgb_7000x20.png", content(7000, 20, 3), "PNG")
    add("rgb_101x57.png", content(101, 57, 4), "PNG", small=True)
    add("rgb_28x28.png", content(28, 28, 5), "PNG", small=True)
    add("rgb_1x1.png", content(1, 1, 6), "PNG", small=True)
    # Alpha: kept (composited as is) and downscaled (premultiplied resize).
    rgba = content(101, 57, 7).convert("RGBA")
    rgba.putalpha(alpha_channel(101, 57, 8))
    add("rgba_101x57.png", rgba, "PNG", small=True)
    rgba = content(7300, 40, 9).convert("RGBA")
    rgba.putalpha(alpha_channel(7300, 40, 10))
    add("rgba_7300x40.png", rgba, "PNG")
    la = content(7300, 30, 11).convert("L").convert("LA")
    la.putalpha(alpha_channel(7300, 30, 12))
    add("la_7300x30.png", la, "PNG")
    # EXIF orientation in PNG's eXIf and WebP's EXIF chunks (Pillow reads both).
    add("png_o8_57x101.png", content(57, 101, 29), "PNG", small=True, exif=exif_bytes(8))
    add("webp_o5_7300x30.webp", content(7300, 30, 30), "WEBP", lossless=True, exif=exif_bytes(5))
    # Greyscale 8-bit, 1-bit and 16-bit (Pillow's "I": clipped to 0..255).
    add("gray_7300x64.png", content(7300, 64, 13).convert("L"), "PNG")
    add("bilevel_7300x40.png", content(7300, 40, 14).convert("1"), "PNG")
    rnd = random.Random(15)  # little-endian 16-bit samples 0..511: most clip to 255
    g16 = Image.frombytes("I;16", (7300, 20), bytes(rnd.randrange(256) if i % 2 == 0 else rnd.randrange(2) for i in range(2 * 7300 * 20)))
    add("gray16_7300x20.png", g16, "PNG")
    # Palette: GIF kept and downscaled (nearest), with a transparent index;
    # a palette PNG with per-entry alpha (tRNS).
    add("gif_300x200.gif", content(300, 200, 16).quantize(64), "GIF", small=True, transparency=3)
    add("gif_7400x50.gif", content(7400, 50, 17).quantize(32), "GIF", transparency=5)
    # A GIF whose palette is the grey ramp: Pillow reads it as "L" (bicubic),
    # here with a transparent value.
    add("gif_gray_7400x40.gif", content(7400, 40, 32).convert("L"), "GIF", optimize=False, transparency=7)
    # Colour keys (tRNS): kept by greyscale ("L" with a transparent value),
    # ignored by the processor for truecolour ("RGB").
    g = content(7300, 30, 33).convert("L")
    add("gray_trns_7300x30.png", g, "PNG", transparency=g.getpixel((5, 5)))
    c = content(7300, 30, 34)
    add("rgb_trns_7300x30.png", c, "PNG", transparency=c.getpixel((5, 5)))
    add("p_7300x30.png", content(7300, 30, 31).quantize(16), "PNG")
    p = content(7300, 30, 18).quantize(16)
    add("p_trns_7300x30.png", p, "PNG", transparency=bytes([0, 128, 255, 64] * 4))
    # JPEG with EXIF orientation 6 and 3 (4:4:4), 4:2:0, 4:2:2 and CMYK.
    add("jpeg_o6_333x517.jpg", content(333, 517, 19), "JPEG", dec=True, quality=95, subsampling=0, exif=exif_bytes(6))
    add("jpeg_o3_7300x200.jpg", content(7300, 200, 20), "JPEG", dec=True, quality=95, subsampling=0, exif=exif_bytes(3))
    add("jpeg_420_641x479.jpg", content(641, 479, 21), "JPEG", dec=True, quality=90)
    add("jpeg_422_301x199.jpg", content(301, 199, 25), "JPEG", dec=True, quality=90, subsampling=1)
    add("jpeg_cmyk_120x90.jpg", content(120, 90, 26).convert("CMYK"), "JPEG", dec=True, quality=95)
    # WebP: lossless with alpha, lossy with and without alpha.
    wp = content(7300, 40, 22).convert("RGBA")
    wp.putalpha(alpha_channel(7300, 40, 23))
    add("webp_ll_7300x40.webp", wp, "WEBP", lossless=True)
    add("webp_lossy_641x479.webp", content(641, 479, 24), "WEBP", dec=True, quality=90)
    wp = content(7301, 41, 27).convert("RGBA")
    wp.putalpha(alpha_channel(7301, 41, 28))
    add("webp_lossy_alpha_7301x41.webp", wp, "WEBP", quality=90)
    return cases


def main():
    outdir = sys.argv[1]
    meta = {}
    for name, small, dec in make_cases(outdir):
        m = preprocess(f"{outdir}/{name}", f"{outdir}/{name}", small, dec)
        m["f32"], m["dec"] = small, dec
        meta[name] = m
    with open(f"{outdir}/cases.json", "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
