// Behavioural models of the ECP5 primitives inside LiteEth's RGMII PHY, for simulation only
// (Yosys ships blackboxes for them, and its cells_sim.v does not run on Icarus 11).
// ODDRX1F: D0 on the pad while SCLK is high, D1 while it is low (both registered at the
// rising edge).  IDDRX1F: the rising-edge and following falling-edge samples, presented
// together after the next rising edge.  DELAYG: 25 ps per tap (LiteEth's TX skew).
`timescale 1ns/1ps
module ODDRX1F(input D0, input D1, input SCLK, input RST, output Q);
    reg q0 = 1'b0, q1 = 1'b0;
    // === : an FPGA's registers power up 0/1, but LiteEth's transmit registers have no
    // initial value and stay x on a 4-state simulator (Icarus) until its first frame; the
    // pad shows them as 0 (so the RGMII sink sees an idle line, not x), and x on SCLK
    // before its clock starts selects D1's register
    always @(posedge SCLK) begin
        q0 <= (D0 === 1'b1);
        q1 <= (D1 === 1'b1);
    end
    assign Q = (SCLK === 1'b1) ? q0 : q1;
endmodule

module IDDRX1F(input D, input SCLK, input RST, output reg Q0, output reg Q1);
    reg r = 1'b0, f = 1'b0;
    initial begin Q0 = 1'b0; Q1 = 1'b0; end
    always @(posedge SCLK) r <= D;
    always @(negedge SCLK) f <= D;
    always @(posedge SCLK) begin
        Q0 <= r;
        Q1 <= f;
    end
endmodule

module DELAYG #(parameter DEL_MODE = "USER_DEFINED", parameter DEL_VALUE = 0)
               (input A, output Z);
    assign #(DEL_VALUE * 0.025) Z = A;
endmodule

module FD1S3BX(input D, input CK, input PD, output reg Q);
    initial Q = 1'b1;
    always @(posedge CK or posedge PD)
        if (PD) Q <= 1'b1;
        else Q <= D;
endmodule

// MDIO is not reachable through LiteEth's standalone core (its pin is an input there)
module TRELLIS_IO #(parameter DIR = "BIDIR") (input B, input I, input T, output O);
    assign O = B;
endmodule
