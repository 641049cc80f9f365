# Regenerates the reference .npy files in this directory. Run once, by hand,
# from this directory with NumPy installed: python3 gen.py
# The tests read the files and do not need NumPy.
import numpy as np
from numpy.lib import format as npformat

def save(name, a, version=None):
    with open(name, "wb") as f:
        if version is None:
            np.save(f, a)
        else:
            npformat.write_array(f, a, version=version, allow_pickle=False)

save("f4_2x3.npy", np.array([[0, 1.5, -2], [3.25, 100, -0.5]], "<f4"))
save("i4_be.npy", np.array([1, -2, 65536, 2**31 - 1], ">i4"))
save("bool.npy", np.array([True, False, True]))
save("scalar_f8.npy", np.array(3.5, "<f8"))
save("f2.npy", np.array([1, -2, 0.5], "<f2"))
save("c8_be.npy", np.array([1 + 2j, -0.5 - 1j], ">c8"))
save("u8_be_v2.npy", np.array([1, 2**64 - 1, 0x0102030405060708], ">u8"), version=(2, 0))
save("i8_v3.npy", np.array([-1, 7], "<i8"), version=(3, 0))
save("empty_0x3.npy", np.zeros((0, 3), "<f8"))
save("fortran_i2.npy", np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3)))
save("structured.npy", np.zeros(2, [("x", "<f4"), ("y", "<i4")]))
save("unicode.npy", np.array(["ab", "xyz"]))
save("datetime.npy", np.array(["2020-01-01"], "M8[D]"))
with open("object.npy", "wb") as f:
    np.save(f, np.array([1, "a", None], dtype=object), allow_pickle=True)
with open("two_arrays.npy", "wb") as f:
    np.save(f, np.array([1, 2, 3], "<i2"))
    np.save(f, np.array([[1, 2], [3, 4]], "|u1"))
