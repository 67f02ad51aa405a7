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
7 0.000000
EOD
$fidelity2 << EOD
0 0.058946
1 0.009365
2 0.006217
3 0.003064
4 0.046820
5 0.067102
6 0.040732
7 0.019419
EOD
$fidelity3 << EOD
0 0.085507
1 0.019505
2 0.018843
3 0.006726
4 0.079096
5 0.128217
6 0.080580
7 0.043774
EOD
$fidelity4 << EOD
0 0.059268
1 0.008287
2 0.006149
3 0.002806
4 0.033339
5 0.053169
6 0.024350
7 0.017912
EOD
$fidelity5 << EOD
0 0.077057
1 0.017525
2 0.018403
3 0.006088
4 0.058320
5 0.101527
6 0.051574
7 0.038375
EOD
plot $fidelity1 using 1:2 with linespoints title "dense", $fidelity2 using 1:2 with linespoints title "pq:topk=0.2", $fidelity3 using 1:2 with linespoints title "pq:topk=0.1", $fidelity4 using 1:2 with linespoints title "oracle:topk=0.2", $fidelity5 using 1:2 with linespoints title "oracle:topk=0.1"
unset output
