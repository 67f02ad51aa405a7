# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.
set encoding utf8

reset
set terminal pngcairo size 800,500
set termoption noenhanced
set output "fidelity.png"
set title 'attention output error against the reference'
set xlabel 'layer'
set ylabel 'relative L2 error'
set logscale y
set key outside right
$fidelity1 << EOD
0 0.000000
1 0.000000
2 0.000000
3 0.000000
4 0.000000
5 0.000000
6 0.000000
EOD
$fidelity2 << EOD
0 0.007523
1 0.004874
2 0.015621
3 0.007880
4 0.004582
5 0.001927
6 0.039143
EOD
$fidelity3 << EOD
0 0.012944
1 0.010598
2 0.034799
3 0.015056
4 0.009363
5 0.004683
6 0.074953
EOD
$fidelity4 << EOD
0 0.006913
1 0.003855
2 0.012311
3 0.005919
4 0.002265
5 0.001082
6 0.021875
EOD
$fidelity5 << EOD
0 0.012176
1 0.008498
2 0.027360
3 0.011536
4 0.006083
5 0.002733
6 0.045596
EOD
$fidelity6 << EOD
0 0.035906
1 0.055671
2 0.108832
3 0.073373
4 0.054666
5 0.050639
6 0.111822
EOD
$fidelity7 << EOD
0 0.022397
1 0.039683
2 0.102080
3 0.052422
4 0.040978
5 0.013684
6 0.078171
EOD
$fidelity8 << EOD
0 0.043028
1 0.064332
2 0.183184
3 0.096336
4 0.055005
5 0.028875
6 0.132946
EOD
plot $fidelity1 using 1:2 with linespoints title "dense", $fidelity2 using 1:2 with linespoints title "pq:topk=0.2", $fidelity3 using 1:2 with linespoints title "pq:topk=0.1", $fidelity4 using 1:2 with linespoints title "oracle:topk=0.2", $fidelity5 using 1:2 with linespoints title "oracle:topk=0.1", $fidelity6 using 1:2 with linespoints title "pq:topk=0.1+hack:bits=4@offload", $fidelity7 using 1:2 with linespoints title "pq:topk=0.2,segment=1024", $fidelity8 using 1:2 with linespoints title "pq:topk=0.1,segment=1024"
unset output

reset
set terminal pngcairo size 800,500
set termoption noenhanced
set output "tradeoff.png"
set title 'KV memory against quality'
$tradeoff << EOD
2080.000000 22.436100 "dense"
2080.000000 22.603742 "pq:topk=0.2"
2080.000000 22.801127 "pq:topk=0.1"
2080.000000 22.522452 "oracle:topk=0.2"
2080.000000 22.640549 "oracle:topk=0.1"
320.000000 22.975272 "pq:topk=0.1+hack:bits=4@offload"
2080.000000 22.736310 "pq:topk=0.2,segment=1024"
2080.000000 23.067764 "pq:topk=0.1,segment=1024"
EOD
set xlabel 'KV bytes per token per layer'
set ylabel 'perplexity (decode path)'
set logscale xy
plot $tradeoff using 1:2 with points pt 7 notitle, $tradeoff using 1:2:3 with labels offset 0,1 font ',8' notitle
unset output
