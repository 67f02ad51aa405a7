# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.
set encoding utf8

reset
set terminal pngcairo size 800,500
set termoption noenhanced
set output "tradeoff.png"
set title 'KV memory against quality'
$tradeoff << EOD
2112.000000 24.118166 "dense"
260.343750 24.741249 "zack:r=0.1,align=4+hack:bits=4"
EOD
set xlabel 'KV bytes per token per layer'
set ylabel 'perplexity (decode path)'
set logscale xy
plot $tradeoff using 1:2 with points pt 7 notitle, $tradeoff using 1:2:3 with labels offset 0,1 font ',8' notitle
unset output
