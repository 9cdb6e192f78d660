"""Extract the uncompressed ELF kernel from a bzImage (xz, zstd or gzip payload)."""
import lzma
import subprocess
import sys
import zlib

src, dst = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()


def unzstd(b):  # python 3.11 has no zstd module: use the CLI
    return subprocess.run(["zstd", "-dcq"], input=b, capture_output=True).stdout


for magic, kind in ((b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x1f\x8b\x08", "gz")):
    i = data.find(magic)
    while i != -1:
        try:
            if kind == "xz":
                out = lzma.LZMADecompressor().decompress(data[i:])
            elif kind == "gz":
                out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[i:])
            else:
                out = unzstd(data[i:])
            if out[:4] == b"\x7fELF":
                open(dst, "wb").write(out)
                sys.exit(0)
        except Exception:
            pass
        i = data.find(magic, i + 1)
print("no ELF kernel found in", src, "(the bzImage will be booted instead)", file=sys.stderr)
sys.exit(1)
