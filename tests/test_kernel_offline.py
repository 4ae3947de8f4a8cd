"""benchmarks/kernel_offline.py's SASS reading: a loop is the range of a backward branch, counted per instruction and
by unit; the compile itself needs the GPU machine's Triton to mean anything and is not run here."""
from _benchmark_scripts import load_benchmark

kernel_offline = load_benchmark("kernel_offline")

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FADD R2, R3, R4 ;
        /*0020*/                   MUFU.EX2 R5, R2 ;
        /*0030*/               @!P0 SHFL.BFLY PT, R6, R5, 0x1, 0x1f ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/                   LDS R7, [R8] ;
        /*0070*/                   STL [R1], R7 ;
        /*0080*/               @P1 BRA `(.L_x_0) ;
.L_x_1:
        /*0090*/                   FFMA R2, R3, R4, R2 ;
        /*00a0*/               @P2 BRA `(.L_x_1) ;
        /*00b0*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*00c0*/                   EXIT ;
"""


def test_loops_are_backward_branches_largest_first():
    loops = kernel_offline.sass_loops(SASS)
    # the forward branch to .L_x_2 is no loop
    assert [loop["instructions"] for loop in loops] == [8, 2]
    first = loops[0]
    assert (first["mufu"], first["bar"], first["local"], first["hgmma"]) == (1, 1, 1, 1)


def test_the_mix_sorts_every_instruction_into_one_unit():
    mix = kernel_offline.sass_loops(SASS)[0]["mix"]
    # the guard predicate of the shuffle does not hide it; the spill store and the branch are "other"
    assert mix == {"fp32": 1, "mufu": 1, "hgmma": 1, "shfl": 1, "shared": 1, "global": 0, "bar": 1, "convert": 0,
                   "other": 2}
    assert sum(mix.values()) == 8
    assert kernel_offline.sass_loops(SASS)[1]["mix"]["fp32"] == 1
