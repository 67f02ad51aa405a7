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
0 0.067315
1 0.010993
2 0.006537
3 0.003571
4 0.053337
5 0.079175
6 0.051643
7 0.022632
EOD
$fidelity3 << EOD
0 0.088571
1 0.021765
2 0.022017
3 0.007466
4 0.087469
5 0.143427
6 0.093886
7 0.050737
EOD
$fidelity4 << EOD
0 0.087260
1 0.026845
2 0.037741
3 0.026887
4 0.091039
5 0.137221
6 0.116774
7 0.078285
EOD
plot $fidelity1 using 1:2 with linespoints title "dense", $fidelity2 using 1:2 with linespoints title "pq:topk=0.2,rerank=1", $fidelity3 using 1:2 with linespoints title "pq:topk=0.1,rerank=1", $fidelity4 using 1:2 with linespoints title "pq:topk=0.1+hack:bits=4@offload"
unset output
