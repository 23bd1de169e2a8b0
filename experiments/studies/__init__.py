"""The lab's study code: tables built from sweep results, the staged outer-lr search, the scaling
protocol and the chaos suite (the library's sweep machinery: diloco/sweeps/)."""
