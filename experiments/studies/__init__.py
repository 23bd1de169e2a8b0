"""The lab's study code: tables built from sweep results, the staged outer-lr search, the scaling
protocol, the chaos suite and the scenarios of faults the kernel makes between hosts (the library's sweep machinery: diloco/sweeps/).
"""
