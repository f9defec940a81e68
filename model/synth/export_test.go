package synth

var LogPortable = logPortable

var RoundLog2 = roundLog2
